"""GRPO with the batch's scale: the episode's return minus its group's mean, over the std of every return in
the batch (+ 1e-4). GTR-Turbo's code normalises advantages over the whole rollout batch: a group whose
returns differ only by a little (say the merged teacher's KL noise in a group that all succeeded) keeps small
advantages, where GRPO's per-group std would blow them up to about +-1."""
from __future__ import annotations

import torch

from protege.rl.advantages import STD_EPS
from protege.rl.estimators.base import Returns, on_every_turn


def estimate(r: Returns, cfg) -> torch.Tensor:
    R = r.episode.view(-1, r.group_size)  # [B, G]
    adv = (R - R.mean(dim=1, keepdim=True)) / (R.std() + STD_EPS)  # [B, G]; std over all B * G returns
    return on_every_turn(adv.flatten(), r.valid)  # [E, T]
