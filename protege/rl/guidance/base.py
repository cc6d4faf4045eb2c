"""A guidance term steers an RL loop beside its own reward: RIL's discriminator similarity, GTR-Turbo's merged
teacher (a KL penalty on the reward, or a cross-entropy on the teacher's thoughts), GTPO's similarity shaping of
failed episodes. The step both loops share (rl/step.py) calls every hook of every term at the same points, in
the order the terms are listed; the defaults do nothing (and a hook no term has takes no ZeRO-3 gather):

- `resumed` once, when a run resumes from a saved state, after the loop restored the terms' `parts`;
- each step: `shape` the step's rewards and returns before the estimator sees them; `loss` once, after the
  policy loss of the step's first pass, its shares backpropagated and added to the step's loss; `after_epoch`
  after each optimizer step (PPO takes `ppo.epochs` per step, every other update one); `after_update` after the
  step's last one;
- `finish` once, on the first process, when the run has reached its last step (not when it stops early).

`step` is what the loop shows a term of the step: `Step` in the multi-turn loop, `QuestionStep` in the question
loop.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from protege.data.rows import Row
from protege.rollout.episodes import Episode
from protege.rl.estimators.base import Returns
from protege.rollout.trajectory import Trajectory


@dataclass
class Step:
    """What a guidance term sees of one step of the multi-turn loop, after the rollout and the policy's forward."""
    policy: torch.nn.Module
    episodes: list[Episode]
    batch: Trajectory            # the episodes packed for training (N rows)
    logp: torch.Tensor           # [N, T-1] pi_old's log-probs of the batch (detached)
    mask: torch.Tensor           # [N, T-1] 1.0 on the policy's own tokens
    device: torch.device
    metrics: dict[str, float]    # the step's logged metrics; a term adds its own
    parts: list[Trajectory] = field(default_factory=list)  # `batch` as micro-batches on the device (Sample.parts)
    tokens: int | None = None    # micro_batch_tokens: the budget of any forward a term runs
    part_rows: list = field(default_factory=list)  # the rows of `batch` each part holds (Sample.rows)
    # on several ranks: each of `episodes`' index in the whole step's batch (every rank's episodes in the order
    # one process plays them); None: `episodes` is the whole batch
    episode_index: list[int] | None = None
    agree: bool = False          # every rank runs as many forwards (ZeRO-3 over several ranks gathers in each)


@dataclass
class QuestionStep:
    """What a guidance term sees of one step of the question loop."""
    rows: list[Row]                   # this process's questions, in group order
    student_texts: list[str]          # G per question
    teacher_texts: list[list[str]]    # G per question (drawn across the chosen teachers)
    is_teacher: torch.Tensor          # [rows of the group] bool: teacher answers inside the policy's group
    metrics: dict[str, float]         # the step's logged metrics; a term adds its own
    policy: torch.nn.Module | None = None
    device: torch.device | None = None
    tokens: int | None = None         # micro_batch_tokens: the budget of any forward a term runs
    # the group packed for training, its micro-batches on the device and the rows each holds (Sample.parts,
    # Sample.rows): set after `shape`, for `loss`
    batch: Trajectory | None = None
    parts: list[Trajectory] = field(default_factory=list)
    part_rows: list = field(default_factory=list)


class Guidance:
    parts: dict = {}  # what exact resume brings back, by file name (see train/runtime/state.py)

    def resumed(self) -> None:
        """After the loop restored `parts` from a saved state."""

    def shape(self, step: Step | QuestionStep, returns: Returns) -> Returns:
        """The step's rewards and returns (estimators/base.py), before the advantage estimator sees them."""
        return returns

    def loss(self, step: Step | QuestionStep) -> Iterable[torch.Tensor]:
        """Terms added to the policy loss, as micro-batch shares that sum to the term (each is backpropagated
        as it comes, so a term's forward holds one micro-batch at a time); none: nothing this step."""
        return ()

    def after_epoch(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        """After each optimizer step of an update (PPO takes one per epoch; the others one per update)."""

    def after_update(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        """After the step's last optimizer step."""

    def finish(self, out_dir: Path, processor) -> None:
        """After the last step of the run (first process only)."""
