"""The GRPO family's update (grpo, dr_grpo, ril, gtpo): one pass, PPO's clipped surrogate per token against
pi_old, plus beta * k3 KL to pi_ref, aggregated as the algorithm does (GRPO: each answer's token mean, averaged;
Dr.GRPO: every token over N * L_max). With one pass pi_old is the policy itself: the same forward's detached
log-probs, so the ratio starts at exactly 1. Tokens sampled by a rollout engine are weighted by truncated
importance sampling."""
from __future__ import annotations

import torch

from protege.rl.losses import policy_loss, rollout_is_weights
from protege.rl.objectives.base import Objective, UpdateBatch, part_of
from protege.rollout.trajectory import score

# the algorithm's aggregation; gtpo and ppo average as grpo does, ril is Dr.GRPO over its 2G group
AGGREGATION = {"grpo": "grpo", "dr_grpo": "dr_grpo", "ril": "dr_grpo", "gtpo": "grpo", "ppo": "grpo"}


class ClippedSurrogate(Objective):
    stats = ("kl", "clip_fraction", "entropy_sum", "is_sum", "is_capped", "lp_gap")

    def __init__(self, cfg, policy, device, **_):
        self.cfg, self.device = cfg, device
        self.clip_eps, self.aggregation = cfg.clip_eps, AGGREGATION[cfg.algorithm]

    def loss(self, policy, i, batch: UpdateBatch):
        part = part_of(batch, i)[0]
        scored = score(policy, part, with_entropy=batch.old is None)
        share, stats = self.policy_term(scored.logp, i, batch)
        if scored.entropy is not None:
            stats["entropy_sum"] = float((scored.entropy.detach() * part.loss_mask.float()).sum())
        return share, stats

    def policy_term(self, logp: torch.Tensor, i: int, batch: UpdateBatch):
        """Micro-batch i's clipped surrogate + KL, from the policy's log-probs `logp` [n, L]."""
        take = batch.sample.take  # the whole batch's [N] / [N, L] tensors, cut to micro-batch i's rows and width
        logp_old = logp.detach() if batch.old is None else take(i, batch.old.logp)
        ref = batch.logp_ref[i] if batch.logp_ref[i] is not None else logp_old
        weights, stats = self.engine_weights(logp, i, batch)
        share, part_stats = policy_loss(logp, logp_old, ref, take(i, batch.adv.tokens).to(self.device),
                                        take(i, batch.sample.mask), clip_eps=self.clip_eps, kl_beta=self.cfg.kl_beta,
                                        aggregation=self.aggregation, max_len=batch.sample.max_len, rows=batch.rows,
                                        tokens=batch.tokens, is_weights=weights)
        return share, {**part_stats, **stats}

    def engine_weights(self, logp: torch.Tensor, i: int, batch: UpdateBatch):
        """Micro-batch i's importance weights of the tokens a rollout engine sampled (None: the policy sampled
        them)."""
        engine, take = batch.sample.engine, batch.sample.take
        if engine is None:
            return None, {}
        lp_r, on = take(i, engine.logp).to(self.device), take(i, engine.sampled).to(self.device)
        weights = rollout_is_weights(logp, lp_r, on, engine.cap)
        return weights, {"is_sum": float((weights * on).sum()), "is_capped": float(((weights >= engine.cap) * on).sum()),
                         "lp_gap": float(((logp.detach() - lp_r) * on).sum())}
