"""RL4VLM's PPO objective (GTR-Turbo's code): PPO with a value head whose policy term takes one ratio per output
(a policy turn), r = exp(sum_t w_t (log pi_t - log pi_old_t)) with w = thought_weight on the thought's tokens and
1 on the rest of the turn's, scored at the sampling temperature (its ratio is on that distribution)."""
from __future__ import annotations

import torch

from protege.rl.guidance.merged_teacher import thought_mask
from protege.rl.losses import output_ratio_loss
from protege.rl.objectives.base import UpdateBatch
from protege.rl.objectives.ppo import PPOWithValueHead
from protege.rollout.trajectory import score


class OutputRatioPPO(PPOWithValueHead):
    def __init__(self, cfg, policy, device, processor=None, action_start=None, **kw):
        super().__init__(cfg, policy, device, **kw)
        self.temperature, self.processor, self.action_start = cfg.temperature, processor, action_start

    def score_old(self, policy, sample):
        old = super().score_old(policy, sample)
        old.ratio_logp = old.logp
        if self.temperature != 1.0:
            old.ratio_logp = sample.whole([score(policy, part, temperature=self.temperature).logp
                                           for part in sample.parts])
        return old

    def prepare(self, batch: UpdateBatch) -> None:
        super().prepare(batch)
        sample, (_, T) = batch.sample, batch.sample.shape
        traj, mask = sample.batch, sample.mask
        thought = thought_mask(traj, self.processor, self.action_start).to(self.device)  # [N, L]
        turn = traj.turn.to(self.device)
        batch.prepared.update(
            weights=mask * (1 - thought + self.ppo.thought_weight * thought),
            # [N, L] each token's flat (episode, turn), -1 off the policy's tokens
            cell=torch.where(mask.bool(), traj.owner.to(self.device).unsqueeze(1) * T + turn.clamp(min=0),
                             torch.full_like(turn, -1)))

    def policy_term(self, logp, i, batch: UpdateBatch):
        take, p = batch.sample.take, batch.prepared  # whole-batch tensors cut to micro-batch i's rows and width
        share, stats = output_ratio_loss(logp, take(i, batch.old.ratio_logp), take(i, p["weights"]),
                                         take(i, p["cell"]), batch.adv.turns.to(self.device).flatten(), self.clip_eps,
                                         cells=p["turns"])
        return share, {**stats, "kl": 0.0}
