"""The contract between a rollout and the shared step (rl/step.py). The step calls, in order: `start` once after
the session resumed; per step `sample`, `rewards` (before guidance terms shape them), `spread` (the estimator's
[E, T] advantages onto the update's rows or tokens), `after_update`, `curve_due` / `curve_point`, `cursor`,
`metrics`; `close` when the run ends."""
from __future__ import annotations

import torch

from protege.rl.estimators.base import Returns
from protege.rl.objectives.base import Advantage, Old
from protege.rl.sample import Sample


class Rollout:
    label = "RL"           # the loop's name in messages
    reads_old = False      # its guidance view or metrics read pi_old's log-probs before the update

    def start(self, s) -> None:
        """After the session resumed (or started): what samples (the policy, or an engine serving its weights)."""

    def sample(self, s, step: int) -> Sample:
        raise NotImplementedError

    def rewards(self, s, sample: Sample, old: Old | None) -> Returns:
        """The step's rewards and returns from the judge or the environment; sets `sample.view` for guidance terms."""
        raise NotImplementedError

    def spread(self, s, sample: Sample, adv: torch.Tensor) -> Advantage:
        raise NotImplementedError

    def after_update(self, s) -> None:
        """After the step's last optimizer step (a rollout engine takes the new weights)."""

    def curve_due(self, s, step: int) -> bool:
        return False

    def curve_point(self, s, step: int) -> dict[str, float]:
        """The learning curve's point on the weights after `step` updates (under the step's fork_rng)."""
        return {}

    def cursor(self) -> dict:
        """What a resumed run needs to draw the same data next (saved with the training state)."""
        return {}

    def metrics(self, s, sample: Sample, returns: Returns, adv: Advantage, old: Old | None,
                totals: dict[str, float], seconds: float) -> dict[str, float]:
        return {}

    def close(self, s) -> None:
        """When the run ends."""
