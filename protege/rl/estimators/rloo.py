"""RLOO (REINFORCE leave-one-out, Ahmadian et al. 2024): the episode's return minus the mean return of the
other G - 1 episodes of its group. Equal to G / (G - 1) times Dr.GRPO's advantage; unbiased, since an
episode's baseline never contains its own return."""
from __future__ import annotations

import torch

from protege.rl.estimators.base import Returns, on_every_turn


def estimate(r: Returns, cfg) -> torch.Tensor:
    R = r.episode.view(-1, r.group_size)  # [B, G]
    others = (R.sum(dim=1, keepdim=True) - R) / (r.group_size - 1)  # [B, G] mean of the other G - 1
    return on_every_turn((R - others).flatten(), r.valid)  # [E, T]
