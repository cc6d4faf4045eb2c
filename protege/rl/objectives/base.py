"""What an objective (an update rule) sees of a step, and what it must provide. An objective turns a step's
samples, their advantages and pi_old / pi_ref log-probs into each micro-batch's share of the loss; the step
(rl/step.py) backpropagates the shares, takes the optimizer steps and runs the guidance terms' hooks.

An objective chooses once, by name (objectives/__init__.py), what the loops once chose by `if` in every phase:
how pi_old is scored, how many passes an update takes, what else it trains beside the policy (PPO's value head,
with its state part), and its loss terms.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protege.rl.estimators.base import Returns
from protege.rl.sample import Sample
from protege.rollout.trajectory import Trajectory, token_logprobs
from protege.runtime.distributed import per_rank, rows_per_rank


@dataclass
class Old:
    """pi_old's view of the step's batch, scored once before the rewards (no gradient)."""
    logp: torch.Tensor                    # [N, L] log pi_old of each scored token
    entropy: torch.Tensor                 # [N, L] pi_old's entropy there
    values: torch.Tensor | None = None    # [E, T] V of each turn's state (objectives with a value head)
    ratio_logp: torch.Tensor | None = None  # [N, L] log pi_old at the objective's own temperature (RL4VLM)


@dataclass
class Advantage:
    tokens: torch.Tensor                  # [N] per row or [N, L] per token, on the device
    turns: torch.Tensor                   # [E, T] per (episode, turn), as the estimator gave it


@dataclass
class UpdateBatch:
    """Everything one update reads: the step's samples, pi_old (None: the policy itself, mu = 1), the returns
    and their advantages, and pi_ref's log-probs per micro-batch (None: no KL term)."""
    sample: Sample
    old: Old | None
    returns: Returns
    adv: Advantage
    logp_ref: list[torch.Tensor | None]
    rows: float                           # the loss's row normaliser: the global batch's rows / ranks
    tokens: float                         # this rank's scored tokens (the stats' denominator)
    step: int = 0                         # the RL step (1-based) this update belongs to
    prepared: dict = field(default_factory=dict)  # an objective's per-step tensors (PPO's GAE targets)
    loss_tokens: float | None = None      # the global batch's scored tokens / ranks: token_mean's normaliser

    @classmethod
    def of(cls, sample: Sample, old: Old | None, returns: Returns | None, adv: Advantage,
           logp_ref: list[torch.Tensor | None], step: int = 0) -> "UpdateBatch":
        """DeepSpeed averages the ranks' gradients, and a step's rows need not split evenly (8 questions on 3 ranks:
        3/3/2), so each rank divides its summed loss by the global batch's rows over the ranks, never by its own
        rows: the average over ranks is then exactly the gradient one process takes of the whole batch."""
        tokens = float(sample.mask.sum())
        return cls(sample, old, returns, adv, logp_ref, rows_per_rank(sample.batch.n), tokens, step,
                   loss_tokens=per_rank(tokens))


class Objective:
    epochs: int = 1            # passes over the step's batch
    mini_batches: int = 1      # optimizer steps per pass, each on its share of the batch's rows (shuffled)
    kl_in_reward: bool = False  # the KL to pi_ref is taken off the rewards (`kl_reward`), not added to the loss
    needs_old: bool = False    # score pi_old before the update even when no rollout or guidance term reads it
    max_grad_norm: float = 1.0
    stats: tuple[str, ...] = ("kl", "clip_fraction")  # the micro-batch figures the step sums and logs

    def modules(self) -> dict[str, torch.nn.Module]:
        """Trained beside the policy (PPO's value head), by name: by the same updater (in a DeepSpeed engine
        with the policy), and each a state part of that name for exact resume."""
        return {}

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trained beside the policy, by the same optimizer (after the policy's, in this order)."""
        return [p for m in self.modules().values() for p in m.parameters()]

    def score_old(self, policy, sample: Sample) -> Old:
        """pi_old's forward over the step's micro-batches (called under no_grad)."""
        scored = [token_logprobs(policy, part, with_entropy=True) for part in sample.parts]
        return Old(sample.whole([lp for lp, _ in scored]), sample.whole([h for _, h in scored]))

    def prepare(self, batch: UpdateBatch) -> None:
        """Per-step tensors every micro-batch reads (into `batch.prepared`)."""

    def kl_reward(self, sample: Sample, old: Old, logp_ref: list[torch.Tensor], returns: Returns) -> Returns:
        """The returns with the KL to pi_ref taken off the rewards (`kl_in_reward` objectives)."""
        raise NotImplementedError

    def loss(self, policy, i: int, batch: UpdateBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """Micro-batch i's share of the step's loss, and its share of each figure in `stats`."""
        raise NotImplementedError


def part_of(batch: UpdateBatch, i: int) -> tuple[Trajectory, list[int] | slice]:
    """Micro-batch i and the rows of the step's batch it holds."""
    return batch.sample.parts[i], batch.sample.rows[i]
