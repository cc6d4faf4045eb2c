"""GRPO: the episode's return minus its group's mean, over the group's std (+ 1e-4)."""
from __future__ import annotations

import torch

from protege.rl.advantages import group_advantages
from protege.rl.estimators.base import Returns, on_every_turn


def estimate(r: Returns, cfg) -> torch.Tensor:
    adv = group_advantages(r.episode.view(-1, r.group_size), scale_by_std=True).flatten()  # [E]
    return on_every_turn(adv, r.valid)  # [E, T]
