"""Learning-rate schedules, as a factor on the configured lr per optimizer step (torch's LambdaLR)."""
from __future__ import annotations

import math


def lr_factor(step: int, cfg) -> float:
    """Linear warm-up over `cfg.warmup_steps`, then constant (`cfg.schedule` constant) or cosine decay to 10%
    of lr by step `cfg.steps`. `step` counts optimizer steps from 0."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def lr_lambda_for(cfg, passes: int = 1):
    """The updater's factor per optimizer step for a section with `schedule` / `warmup_steps` (None: a constant
    rate, as the sections without them train: the question loop keeps RIL's static rate). An RL step of
    `passes` optimizer steps (PPO's epochs) takes one rate."""
    if getattr(cfg, "schedule", "constant") == "constant" and not getattr(cfg, "warmup_steps", 0):
        return None
    return lambda i: lr_factor(i // passes, cfg)
