"""One step's samples from pi_old, packed for the update: what a rollout (rl/rollouts/) hands the shared step."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protege.rollout.trajectory import Trajectory


@dataclass
class EngineLogprobs:
    """A rollout engine's log-prob of each token it sampled (vLLM in bf16), for truncated importance sampling."""
    logp: torch.Tensor      # [N, L]
    sampled: torch.Tensor   # [N, L] 1.0 on the engine's own finite-log-prob tokens
    cap: float              # w = min(pi_old / pi_engine, cap)
    nonfinite: float        # sampled tokens whose log-prob came back NaN / inf (weight 1 there)


@dataclass
class Sample:
    batch: Trajectory              # this rank's rows (answers or episodes), packed
    parts: list[Trajectory]        # `batch` as micro-batches on the device, in row order
    rows: list[slice]              # the rows of `batch` each part holds
    mask: torch.Tensor             # [N, L] 1.0 on the tokens the loss scores
    max_len: int                   # Dr.GRPO's constant denominator: the longest answer or episode possible
    rollout_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # the step's logged figures; guidance terms add theirs
    view: object = None            # what guidance terms see (guidance/base.py: Step or QuestionStep)
    shape: tuple[int, int] | None = None  # (episodes, turns) of a multi-turn batch
    engine: EngineLogprobs | None = None
