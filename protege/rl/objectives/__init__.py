"""Update rules by name: a new objective is a file here and a line in OBJECTIVES (see docs/adding-an-algorithm.md)."""
from __future__ import annotations

from protege.rl.objectives.base import Objective
from protege.rl.objectives.clipped import ClippedSurrogate
from protege.rl.objectives.ppo import PPOWithValueHead
from protege.rl.objectives.rl4vlm import OutputRatioPPO

OBJECTIVES: dict[str, type[Objective]] = {
    "clipped": ClippedSurrogate,   # grpo, dr_grpo, ril, gtpo
    "ppo": PPOWithValueHead,       # ppo with ppo.objective: token
    "rl4vlm": OutputRatioPPO,      # ppo with ppo.objective: rl4vlm
}


def objective_name(cfg) -> str:
    """The update rule an RL section's algorithm trains with."""
    if cfg.algorithm != "ppo":
        return "clipped"
    return "rl4vlm" if cfg.ppo.objective == "rl4vlm" else "ppo"


def make_objective(cfg, policy, device, **context) -> Objective:
    """`context`: what an objective may read besides the section (processor, action_start for RL4VLM's thoughts)."""
    return OBJECTIVES[objective_name(cfg)](cfg, policy, device, **context)
