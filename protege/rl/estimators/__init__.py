"""Advantage estimators, by the name `rl.advantage` / `agent.rl.advantage` / `tool.rl.advantage` selects.

Adding one: a module here with `estimate(returns, cfg) -> [E, T]` (see base.py), and its name on the import
line below. Nothing else changes: the loops, the config check and the docs read this registry.
"""
from __future__ import annotations

import functools
from types import ModuleType

import torch

from protege.errors import UserFacingError
from protege.rl.estimators import dr_grpo, gae, grpo, grpo_batch, gtpo, rloo  # the registry line: one module per estimator
from protege.rl.estimators.base import Estimator, Returns, shifted

# every module imported above that defines `estimate`, under its module name
ESTIMATORS: dict[str, Estimator] = {name: m.estimate for name, m in sorted(globals().items())
                                    if isinstance(m, ModuleType) and hasattr(m, "estimate")}

__all__ = ["ESTIMATORS", "Returns", "estimator"]


def estimator(cfg) -> Estimator:
    """The estimator an RL config section names: its `advantage`, else its algorithm's own (RIL's is Dr.GRPO's,
    over the 2G group of student and teacher answers; PPO's is GAE with its value head)."""
    name = cfg.advantage or {"ril": "dr_grpo", "ppo": "gae"}.get(cfg.algorithm, cfg.algorithm)
    if name not in ESTIMATORS:
        raise UserFacingError(f"advantage {name!r}: no such estimator; known: {', '.join(sorted(ESTIMATORS))} "
                              "(modules of protege/rl/estimators)")
    est = ESTIMATORS[name]
    if getattr(globals()[name], "SHIFTS_ITSELF", False):
        return est
    @functools.wraps(est)  # __wrapped__: the module's own estimate
    def with_after(r: Returns, c) -> torch.Tensor:
        return shifted(est(r, c), r)  # a term acting after estimation (Returns.after)

    return with_after
