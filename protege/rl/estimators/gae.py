"""PPO's advantage: generalized advantage estimation over turns with the value head's V (ppo.gamma,
ppo.lam), normalised over every turn of the batch (GTR-Turbo / RL4VLM normalise over the rollout buffer): on
several ranks, over every rank's turns (collective), as one process normalises the whole batch."""
from __future__ import annotations

import torch

from protege.errors import UserFacingError
from protege.rl.advantages import STD_EPS
from protege.rl.estimators.base import Returns, shifted
from protege.rl.ppo import gae
from protege.runtime.distributed import mean_std_over_ranks

SHIFTS_ITSELF = True  # `after` enters before the batch normalisation (see base.Returns)


def estimate(r: Returns, cfg) -> torch.Tensor:
    p = getattr(cfg, "ppo", None)
    if r.values is None or p is None:
        raise UserFacingError("the gae advantage needs a value head: it is agent.rl.algorithm ppo's estimator")
    adv = shifted(gae(r.turn, r.values, r.valid, p.gamma, p.lam)[0], r)  # [E, T]
    mean, std = mean_std_over_ranks(adv[r.valid])
    return torch.where(r.valid, (adv - mean) / (std + STD_EPS), torch.zeros_like(adv))  # [E, T]
