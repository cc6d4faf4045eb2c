"""A guidance term steers an RL loop beside its own reward: GTR-Turbo's merged teacher (a KL penalty on the
reward, or a cross-entropy on the teacher's thoughts), GTPO's similarity shaping of failed episodes. The loop
calls every term at the same points of a step, in the order they are listed; the defaults do nothing.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from protege.rollout.episodes import Episode
from protege.rl.estimators.base import Returns
from protege.rollout.trajectory import Trajectory


@dataclass
class Step:
    """What a guidance term sees of one step, after the rollout and the policy's forward."""
    policy: torch.nn.Module
    episodes: list[Episode]
    batch: Trajectory            # the episodes packed for training (N rows)
    logp: torch.Tensor           # [N, T-1] pi_old's log-probs of the batch (detached)
    mask: torch.Tensor           # [N, T-1] 1.0 on the policy's own tokens
    device: torch.device
    metrics: dict[str, float]    # the step's logged metrics; a term adds its own
    parts: list[Trajectory] = field(default_factory=list)  # `batch` as micro-batches on the device, in row order
    tokens: int | None = None    # micro_batch_tokens: the budget of any forward a term runs


class Guidance:
    parts: dict = {}  # what exact resume brings back, by file name (see train/runtime/state.py)

    def resumed(self) -> None:
        """After the loop restored `parts` from a saved state."""

    def shape(self, step: Step, returns: Returns) -> Returns:
        """The rewards, before the advantage estimator sees them."""
        return returns

    def loss(self, step: Step) -> Iterable[torch.Tensor]:
        """Terms added to the policy loss, as micro-batch shares that sum to the term (each is backpropagated
        as it comes, so a term's forward holds one micro-batch at a time); none: nothing this step."""
        return ()

    def after_epoch(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        """After each optimizer step of an update (PPO takes one per epoch; the others one per update)."""

    def after_update(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        """After the update's last optimizer step."""

    def finish(self, out_dir: Path, processor) -> None:
        """After the last step of the run."""
