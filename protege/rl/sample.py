"""One step's samples from pi_old, packed for the update: what a rollout (rl/rollouts/) hands the shared step."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protege.rollout.trajectory import Trajectory, join_parts


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
    parts: list[Trajectory]        # `batch` as micro-batches on the device (rollout.trajectory.length_parts)
    rows: list[list[int] | slice]  # the rows of `batch` each part holds, in the part's order
    mask: torch.Tensor             # [N, L] 1.0 on the tokens the loss scores
    max_len: int                   # Dr.GRPO's constant denominator: the longest answer or episode possible
    rollout_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # the step's logged figures; guidance terms add theirs
    view: object = None            # what guidance terms see (guidance/base.py: Step or QuestionStep)
    shape: tuple[int, int] | None = None  # (episodes, turns) of a multi-turn batch
    engine: EngineLogprobs | None = None

    # Per-token tensors that outlive a forward (pi_old's log-probs, advantages, masks) are kept [N, L] over the
    # whole batch, as the estimators, guidance terms and metrics read them; each part's forward gives [n, L_i]
    # for its own width, its rows' first L_i columns (trimming keeps scored position t at t). Two helpers map
    # between the two, so no reader of the whole batch needs to know how it was grouped.
    def take(self, i: int, t: torch.Tensor) -> torch.Tensor:
        """Part i's share of a whole-batch tensor: [N] per row, or [N, L] per token cut to the part's width."""
        rows = self.rows[i]
        return t[rows] if t.dim() == 1 else t[rows, :self.parts[i].loss_mask.shape[1]]

    def whole(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """The parts' per-token tensors [n, L_i], in part order, as one [N, L] over the batch's rows."""
        return join_parts(pieces, self.rows, *self.mask.shape)
