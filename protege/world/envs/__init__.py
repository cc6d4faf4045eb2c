"""Seeded multi-turn visual games for agent RL. `make_env("grid", size=4, ...)` builds one.

Games: "grid" (grid.py) and "tool" (tool.py, python tool calls in the sandbox).

Seeds: train on `train_seed(i)` (= i, below 10**6) and evaluate on `eval_seed(i)` (= 10**6 + i);
the two sets never overlap.
"""
from __future__ import annotations

from protege.world.envs.grid import (ACTIONS, EVAL_SEED_OFFSET, GridEnv, GridParams, GridState,
                                     Observation, StepResult, action_start, bfs_distance, draw_layout,
                                     eval_seed, parse_action, render, train_seed)
from protege.world.envs.solver import all_texts, best_move, expert_episode, solve
from protege.world.envs.tool import ToolEnv, ToolParams

# a tool env built here runs its code in a default Sandbox (protege.tools.sandbox); pass one to ToolEnv
# to set its limits
ENVS = {"grid": (GridEnv, GridParams), "tool": (ToolEnv, ToolParams)}


def make_env(name: str, **params) -> GridEnv | ToolEnv:
    """A fresh env by name, its params given as keywords (defaults otherwise)."""
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; known envs: {sorted(ENVS)}")
    env_cls, params_cls = ENVS[name]
    known = set(params_cls.__dataclass_fields__)
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown {name!r} env params {unknown}; expected some of {sorted(known)}")
    return env_cls(params_cls(**params))


__all__ = ["ACTIONS", "ENVS", "EVAL_SEED_OFFSET", "GridEnv", "GridParams", "GridState", "Observation",
           "StepResult", "ToolEnv", "ToolParams", "action_start", "all_texts", "best_move", "bfs_distance", "draw_layout",
           "eval_seed", "expert_episode", "make_env", "parse_action", "render", "solve", "train_seed"]
