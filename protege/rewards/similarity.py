"""RIL's similarity reward from the discriminator's score D(q, o) = P(o came from the student)."""
from __future__ import annotations

import torch


def similarity_reward(d_scores: torch.Tensor, mode: str) -> torch.Tensor:
    """[N] scores in [0, 1] -> [N] rewards; high when the answer looks like a teacher's.

    binary (RIL default): 1[D < 0.5];  continuous: 1 - D;  levels:k: 1 - D rounded to the nearest of
    k evenly spaced levels in [0, 1] (levels:2 equals binary).
    """
    teacher_like = 1.0 - d_scores
    if mode == "binary":
        return (d_scores < 0.5).to(d_scores.dtype)
    if mode == "continuous":
        return teacher_like
    if mode.startswith("levels:"):
        k = int(mode.split(":", 1)[1])
        if k < 2:
            raise ValueError(f"similarity {mode!r}: need at least 2 levels")
        return torch.round(teacher_like * (k - 1)) / (k - 1)
    raise ValueError(f"unknown similarity {mode!r}; expected binary, continuous or levels:K")
