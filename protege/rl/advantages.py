"""Group-relative advantages (pure tensor functions)."""
from __future__ import annotations

import torch

STD_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, scale_by_std: bool) -> torch.Tensor:
    """A_i = R_i - mean_j R_j within each group; GRPO also divides by (std_j R_j + 1e-4), Dr.GRPO does not.

    rewards: [B, G] (B groups = questions, G responses each) -> advantages [B, G].
    std is the unbiased sample std, as in GRPO's reference implementations.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]
    if not scale_by_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + STD_EPS)  # [B, G]
