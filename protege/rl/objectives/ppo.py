"""PPO over turns (GTR-Turbo's base, as RL4VLM): a value head on the policy's last hidden state, trained beside
it by the same optimizer towards GAE's targets; `ppo.epochs` passes per step at `ppo.clip_eps`, each micro-batch's
loss the clipped surrogate + value_coef * the value loss. The head, its state part, pi_old's values, the targets
and the value loss live here; the tensor functions in rl/ppo.py.

On several ranks (DeepSpeed) the head is in the engine with the policy (updaters.DeepSpeedUpdater's `beside`),
so its gradients are averaged over the ranks like the policy's; each rank's value loss is divided by the whole
batch's turns over the ranks (distributed.per_rank), so that average is the gradient one process takes of
the whole batch's mean."""
from __future__ import annotations

import torch

from protege.rl.objectives.base import Old, UpdateBatch, part_of
from protege.rl.objectives.clipped import ClippedSurrogate
from protege.rl.ppo import ValueHead, gae, scored_with_values, turn_values, value_loss
from protege.rollout.trajectory import score
from protege.runtime.distributed import per_rank


class PPOWithValueHead(ClippedSurrogate):
    needs_old = True  # V of each turn when the episodes were played
    stats = ("kl", "clip_fraction", "value_loss")

    def __init__(self, cfg, policy, device, **kw):
        super().__init__(cfg, policy, device, **kw)
        # its zero init still draws from torch's generator: made before anything else that does
        self.head = ValueHead(policy.config.get_text_config().hidden_size).to(device)
        self.ppo = cfg.ppo
        self.epochs, self.clip_eps, self.max_grad_norm = cfg.ppo.epochs, cfg.ppo.clip_eps, cfg.ppo.max_grad_norm
        self.temperature = 1.0  # the ratio's

    def modules(self):
        return {"value_head": self.head}

    def score_old(self, policy, sample):
        scored = [scored_with_values(policy, self.head, part) for part in sample.parts]
        values = turn_values(sample.whole([v for _, _, v in scored]).cpu(), sample.batch, *sample.shape)
        return Old(sample.whole([lp for lp, _, _ in scored]), sample.whole([h for _, h, _ in scored]), values)

    def prepare(self, batch: UpdateBatch) -> None:
        returns, values = batch.returns, batch.old.values
        _, targets = gae(returns.turn, values, returns.valid, self.ppo.gamma, self.ppo.lam)  # [E, T] V's targets
        if returns.after is not None:  # a term on the returns after estimation moves the targets too
            targets = targets + returns.after * returns.valid
        # the whole batch's turns over the ranks (collective): the value loss's (and RL4VLM's per-output ratio
        # term's) denominator, a rank's share of the mean over every rank's turns; one process: its turns
        batch.prepared.update(targets=targets.to(self.device), turns=per_rank(float(returns.valid.sum())),
                              values_old=values.to(self.device), valid=returns.valid.to(self.device))

    def loss(self, policy, i, batch: UpdateBatch):
        part, p = part_of(batch, i)[0], batch.prepared
        if batch.step <= self.ppo.value_warmup_steps:  # the head alone, on the frozen policy's features
            with torch.no_grad():
                hidden = score(policy, part, with_hidden=True).hidden
            v_tok, share, stats = self.head(hidden), None, {"kl": 0.0, "clip_fraction": 0.0}
        else:
            logp, _, v_tok = scored_with_values(policy, self.head, part, temperature=self.temperature)
            share, stats = self.policy_term(logp, i, batch)
        v_part, held = turn_values(v_tok, part, *batch.sample.shape, with_found=True)
        v_share = value_loss(v_part, p["targets"], p["valid"] & held, turns=p["turns"], old=p["values_old"],
                             clip=self.ppo.value_clip)
        stats["value_loss"] = float(v_share.detach())
        v_share = self.ppo.value_coef * v_share
        return (v_share if share is None else share + v_share), stats
