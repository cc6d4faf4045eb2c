"""GTPO: each turn's discounted return, normalised over the pool `gtpo.scope` names (group, batch or turn)."""
from __future__ import annotations

import torch

from protege.errors import UserFacingError
from protege.rl.estimators.base import Returns
from protege.rl.gtpo import discounted_returns, turn_advantages


def estimate(r: Returns, cfg) -> torch.Tensor:
    g = getattr(cfg, "gtpo", None)
    if g is None:
        raise UserFacingError("the gtpo advantage needs a gtpo section (gamma, scope): it is an agent.rl / tool.rl "
                              "estimator")
    return turn_advantages(discounted_returns(r.turn, r.valid, g.gamma), r.valid, r.group_size, g.scope)  # [E, T]
