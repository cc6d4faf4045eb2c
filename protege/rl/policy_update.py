"""The question loop's policy update: the clipped surrogate + KL of a step's group, backpropagated micro-batch by
micro-batch as shares of the whole step's loss across every rank.

DeepSpeed averages the ranks' gradients, and a step's questions need not split evenly (8 on 3 ranks: 3/3/2), so
each rank divides its summed loss by the global batch's rows over the number of ranks, never by its own rows:
the average over ranks is then exactly the gradient one process would take of the whole batch.
"""
from __future__ import annotations

import torch

from protege.config import RLConfig
from protege.rl.losses import policy_loss, rollout_is_weights
from protege.rollout.trajectory import Trajectory, score
from protege.runtime.distributed import rows_per_rank


def backward_policy_loss(policy, updater, traj: Trajectory, parts: list[Trajectory], logp_ref: list,
                         adv: torch.Tensor, cfg: RLConfig, max_len: int, device: torch.device, *,
                         rollout_logp: torch.Tensor | None = None, sampled: torch.Tensor | None = None,
                         where: str = "") -> dict[str, float]:
    """Backpropagates the policy loss of `traj` (this rank's rows, split into `parts` in row order) through
    `updater.backward`; the caller steps. pi_old is the policy itself (mu = 1): each part's detached log-probs,
    so the ratio starts at 1. `logp_ref[i]`: part i's reference log-probs (None: no KL term); `adv` [N] per row;
    `rollout_logp`, `sampled` [N, L]: an engine's log-probs of the tokens it sampled, for truncated importance
    sampling. Returns the step's sums for its metrics (loss, kl, clip fraction, entropy, TIS weights)."""
    n_rows = rows_per_rank(traj.n)  # the global batch's rows / ranks: see the module docstring
    n_tok = float(traj.loss_mask.sum())  # this rank's scored tokens (the stats' denominator)
    totals = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy_sum": 0.0, "is_sum": 0.0, "is_capped": 0.0,
              "lp_gap": 0.0}
    first = 0
    for part, ref_lp in zip(parts, logp_ref):
        rows = slice(first, first + part.n)
        first += part.n
        scored = score(policy, part, with_entropy=True)
        m = part.loss_mask.float()
        weights = None
        if rollout_logp is not None:
            lp_r, on = rollout_logp[rows].to(device), sampled[rows].to(device)
            weights = rollout_is_weights(scored.logp, lp_r, on, cfg.tis_cap)
            totals["is_sum"] += float((weights * on).sum())
            totals["is_capped"] += float(((weights >= cfg.tis_cap) * on).sum())
            totals["lp_gap"] += float(((scored.logp.detach() - lp_r) * on).sum())
        share, stats = policy_loss(scored.logp, scored.logp.detach(),
                                   scored.logp.detach() if ref_lp is None else ref_lp, adv[rows].to(device), m,
                                   clip_eps=cfg.clip_eps, kl_beta=cfg.kl_beta,
                                   aggregation="grpo" if cfg.algorithm == "grpo" else "dr_grpo",
                                   max_len=max_len, rows=n_rows, tokens=n_tok, is_weights=weights)
        if not torch.isfinite(share):
            raise FloatingPointError(f"RL loss is {share.item()}{where}")
        updater.backward(share)
        totals["loss"] += float(share.detach())
        totals["entropy_sum"] += float((scored.entropy.detach() * m).sum())
        totals["kl"] += float(stats["kl"])
        totals["clip_fraction"] += float(stats["clip_fraction"])
    return totals
