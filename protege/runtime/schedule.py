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
