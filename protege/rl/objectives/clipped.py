"""The GRPO family's update (grpo, dr_grpo, ril, gtpo): PPO's clipped surrogate per token against pi_old (the
clip range [1 - clip_eps_low, 1 + clip_eps_high], DAPO's clip-higher when they differ), plus beta * KL to
pi_ref (k3 unless `kl.estimator` names another; or taken off the rewards with `kl.placement: reward`), minus
entropy_coef * the policy's entropy, aggregated as `loss_aggregation` names, by default as the algorithm does
(GRPO: each answer's token mean, averaged; Dr.GRPO: every token over N * L_max). With one pass of one
mini-batch pi_old is the policy itself: the same forward's detached log-probs, so the ratio starts at exactly
1; more (`ppo_epochs`, `mini_batches`) score pi_old once before the first. Tokens sampled by a rollout engine
are weighted by truncated importance sampling."""
from __future__ import annotations

import dataclasses

import torch
from torch.utils.checkpoint import checkpoint

from protege.models.logprobs import LOGIT_CHUNK_BYTES, _apply_head, forward_hidden, logprobs_from_logits
from protege.models.precision import autocast_like
from protege.rl.estimators.base import Returns
from protege.rl.losses import KL_ESTIMATORS, policy_loss, rollout_is_weights, turn_sums
from protege.rl.objectives.base import Objective, Old, UpdateBatch, part_of
from protege.rl.sample import Sample
from protege.rollout.trajectory import Trajectory, score

# the algorithm's own aggregation (loss_aggregation: auto); gtpo and ppo average as grpo does, ril is Dr.GRPO
# over its 2G group
AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "dr_grpo", "ril": "dr_grpo", "gtpo": "seq_mean_token_mean",
               "ppo": "seq_mean_token_mean"}


def aggregation_of(cfg) -> str:
    how = getattr(cfg, "loss_aggregation", "auto")
    return AGGREGATION[cfg.algorithm] if how == "auto" else how


class ClippedSurrogate(Objective):
    stats = ("kl", "clip_fraction", "entropy_sum", "is_sum", "is_capped", "lp_gap")

    def __init__(self, cfg, policy, device, **_):
        self.cfg, self.device = cfg, device
        self.clip_eps, self.aggregation = cfg.clip_eps, aggregation_of(cfg)
        # the sections without these settings (agent.rl, tool.rl) train as they always did
        self.clip_low, self.clip_high = getattr(cfg, "clip_eps_low", None), getattr(cfg, "clip_eps_high", None)
        kl = getattr(cfg, "kl", None)
        self.kl_estimator = kl.estimator if kl is not None else "k3"
        self.kl_in_reward = kl is not None and kl.placement == "reward" and cfg.kl_beta > 0
        self.entropy_coef = getattr(cfg, "entropy_coef", 0.0)
        self.epochs, self.mini_batches = getattr(cfg, "ppo_epochs", 1), getattr(cfg, "mini_batches", 1)
        # a later pass, a later mini-batch or the rewards read pi_old after (or before) the policy moved
        self.needs_old = type(self).needs_old or self.epochs > 1 or self.mini_batches > 1 or self.kl_in_reward

    def loss(self, policy, i, batch: UpdateBatch):
        part = part_of(batch, i)[0]
        mask = batch.sample.take(i, batch.sample.mask)
        if self.entropy_coef:
            logp, entropy = scored_with_entropy(policy, part)
            share, stats = self.policy_term(logp, i, batch, entropy=entropy)
            stats["entropy_sum"] = float((entropy.detach() * mask).sum())
            return share, stats
        scored = score(policy, part, with_entropy=batch.old is None)
        share, stats = self.policy_term(scored.logp, i, batch)
        if scored.entropy is not None:
            stats["entropy_sum"] = float((scored.entropy.detach() * mask).sum())
        return share, stats

    def policy_term(self, logp: torch.Tensor, i: int, batch: UpdateBatch, entropy: torch.Tensor | None = None):
        """Micro-batch i's clipped surrogate + KL (- the entropy bonus), from the policy's log-probs `logp` [n, L]
        (and its entropy there, with its graph)."""
        take = batch.sample.take  # the whole batch's [N] / [N, L] tensors, cut to micro-batch i's rows and width
        logp_old = logp.detach() if batch.old is None else take(i, batch.old.logp)
        ref = batch.logp_ref[i] if batch.logp_ref[i] is not None else logp_old
        weights, stats = self.engine_weights(logp, logp_old, i, batch)
        low = self.clip_eps if self.clip_low is None else self.clip_low
        share, part_stats = policy_loss(logp, logp_old, ref, take(i, batch.adv.tokens).to(self.device),
                                        take(i, batch.sample.mask), clip_eps=low, clip_eps_high=self.clip_high,
                                        kl_beta=0.0 if self.kl_in_reward else self.cfg.kl_beta,
                                        kl_estimator=self.kl_estimator, aggregation=self.aggregation,
                                        max_len=batch.sample.max_len, rows=batch.rows, tokens=batch.tokens,
                                        loss_tokens=batch.loss_tokens, is_weights=weights, entropy=entropy,
                                        entropy_coef=self.entropy_coef)
        return share, {**part_stats, **stats}

    def engine_weights(self, logp: torch.Tensor, logp_old: torch.Tensor, i: int, batch: UpdateBatch):
        """Micro-batch i's importance weights pi_old / pi_engine of the tokens a rollout engine sampled (None:
        the policy sampled them)."""
        engine, take = batch.sample.engine, batch.sample.take
        if engine is None:
            return None, {}
        lp_r, on = take(i, engine.logp).to(self.device), take(i, engine.sampled).to(self.device)
        weights = rollout_is_weights(logp_old, lp_r, on, engine.cap)
        return weights, {"is_sum": float((weights * on).sum()), "is_capped": float(((weights >= engine.cap) * on).sum()),
                         "lp_gap": float(((logp.detach() - lp_r) * on).sum())}

    def kl_reward(self, sample: Sample, old: Old, logp_ref: list[torch.Tensor], returns: Returns) -> Returns:
        """PPO-RLHF's placement: each turn's reward pays kl_beta times the KL of its tokens (pi_old, the policy
        that sampled them, against pi_ref), summed over them; the advantages then carry it and the loss has no
        KL term."""
        traj = sample.batch
        kl = KL_ESTIMATORS[self.kl_estimator](old.logp, sample.whole(logp_ref))  # [N, L]
        dev = kl.device
        E, T = returns.turn.shape
        penalty = self.cfg.kl_beta * turn_sums(kl, traj.loss_mask.to(dev), traj.owner.to(dev), traj.turn.to(dev),
                                               E, T).cpu()
        penalty = torch.where(returns.valid, penalty, torch.zeros_like(penalty)).to(returns.turn.dtype)
        total = None if returns.total is None else returns.total - penalty.sum(dim=1)
        return dataclasses.replace(returns, turn=returns.turn - penalty, total=total)


def _head_logp_entropy(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor):
    logp_all = torch.log_softmax(_apply_head(head, hidden).float(), dim=-1)  # [K, V]
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def scored_with_entropy(model, traj: Trajectory) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's log-prob of each scored token and its entropy there, both with their graph, for the entropy
    bonus: [N, L] each, 0 off the loss mask. As models/logprobs.py scores, the LM head runs on chunks of the
    scored positions, each recomputed in the backward pass, so no [tokens, vocab] tensor outlives its chunk;
    the chunks are half as long, as the entropy's backward holds the chunk's probabilities beside its
    log-probs."""
    keep, start, inputs = traj.loss_mask.bool(), traj.start, traj.inputs
    targets_all = inputs["input_ids"][:, start + 1:]
    last, head = forward_hidden(model, inputs)
    if last is None:  # a family whose head alone does not give its logits: the model's own, whole
        logits = model(**inputs, use_cache=False).logits[:, start:-1]
        logp, entropy = logprobs_from_logits(logits, targets_all, with_entropy=True)
        return logp * keep, entropy * keep
    h, targets = last[:, start:-1][keep], targets_all[keep]  # [K, H], [K]
    vocab = getattr(head, "out_features", None) or getattr(head.weight, "ds_shape", head.weight.shape)[0]
    chunk = max(1, LOGIT_CHUNK_BYTES // (8 * vocab))
    pieces = []
    with autocast_like(model):
        for c in range(0, h.shape[0], chunk):
            pieces.append(checkpoint(_head_logp_entropy, head, h[c:c + chunk], targets[c:c + chunk],
                                     use_reentrant=False))
    logp = torch.zeros(keep.shape, dtype=torch.float32, device=h.device)
    entropy = torch.zeros(keep.shape, dtype=torch.float32, device=h.device)
    if pieces:
        logp = logp.index_put((keep,), torch.cat([p[0] for p in pieces]))
        entropy = entropy.index_put((keep,), torch.cat([p[1] for p in pieces]))
    return logp, entropy
