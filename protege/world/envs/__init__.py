"""Seeded multi-turn visual games for agent RL. `make_env("grid", size=4, ...)` builds one.

Games: "grid" (grid.py), "points24" (points24.py, the card game of RL4VLM and GTR-Turbo) and "tool"
(tool.py, python tool calls in the sandbox). `ENVS` is the one place that names each game's env class, its
params, its scripted solver and where an output's action begins; the agent recipes look a game up there by
`agent.env`, and its params come from the config section of the same name (`agent.grid`, `agent.points24`).

Seeds: train on `train_seed(i)` (= i, below 10**6) and evaluate on `eval_seed(i)` (= 10**6 + i);
the two sets never overlap.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protege.world.envs.grid import (ACTIONS, EVAL_SEED_OFFSET, GridEnv, GridParams, GridState,
                                     Observation, StepResult, action_start, bfs_distance, draw_layout,
                                     eval_seed, parse_action, render, train_seed)
from protege.world.envs import points24, points24_solver
from protege.world.envs.points24 import Points24Env, Points24Params
from protege.world.envs.solver import all_texts, best_move, expert_episode, solve
from protege.world.envs.tool import ToolEnv, ToolParams


def no_action(text: str) -> None:
    """A game whose outputs have no action part (the tool game): everything the policy writes is thought."""
    return None


@dataclass(frozen=True)
class EnvSpec:
    env: type                                    # env(params) -> an env with reset(seed) / step(text)
    params: type                                 # its frozen params dataclass
    # (params, seed) -> [(observation, solver text)] per turn; None where the solver needs more (the tool
    # game's runs its code in a sandbox: protege.world.envs.tool_solver)
    expert_episode: Callable[..., list] | None
    action_start: Callable[[str], int | None]    # where the action part of an output begins (None: no action)


# a tool env built here runs its code in a default Sandbox (protege.tools.sandbox); pass one to ToolEnv
# to set its limits
ENVS = {"grid": EnvSpec(GridEnv, GridParams, expert_episode, action_start),
        "points24": EnvSpec(Points24Env, Points24Params, points24_solver.expert_episode, points24.action_start),
        "tool": EnvSpec(ToolEnv, ToolParams, None, no_action)}


def env_spec(name: str) -> EnvSpec:
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}; known envs: {sorted(ENVS)}")
    return ENVS[name]


def make_params(name: str, **params):
    """The params of env `name` from keywords (defaults otherwise)."""
    spec = env_spec(name)
    known = set(spec.params.__dataclass_fields__)
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown {name!r} env params {unknown}; expected some of {sorted(known)}")
    return spec.params(**params)


def make_env(name: str, **params) -> GridEnv | Points24Env | ToolEnv:
    """A fresh env by name, its params given as keywords (defaults otherwise)."""
    return env_spec(name).env(make_params(name, **params))


__all__ = ["ACTIONS", "ENVS", "EVAL_SEED_OFFSET", "EnvSpec", "GridEnv", "GridParams", "GridState", "Observation",
           "Points24Env", "Points24Params", "StepResult", "ToolEnv", "ToolParams", "action_start", "all_texts",
           "best_move", "bfs_distance", "draw_layout", "env_spec", "eval_seed", "expert_episode", "make_env",
           "make_params", "no_action", "parse_action", "render", "solve", "train_seed"]
