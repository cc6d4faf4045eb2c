"""What a rollout hands the update: one type for a question's answers and for multi-turn episodes.

A single-turn answer is a one-turn episode: its row is the prompt (left-padded) and the answer, and its
targets start where the prompt ends. A multi-turn episode is one row, or one row per turn under context
"current"; its targets start at the second token. Either way position t of the scored rows predicts token
t + 1 of `start + t + 1`, and every loss, estimator and guidance term addresses rows, turns and owners.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protege.generation.transformers_backend import Completions


@dataclass
class Trajectory:
    """Rows of token ids with what the update needs to know about each target token."""
    inputs: dict[str, torch.Tensor]       # input_ids / attention_mask [N, T] (+ the family's vision inputs)
    loss_mask: torch.Tensor               # [N, L] 1 where the target token is trained on (the policy's, a teacher's)
    turn: torch.Tensor                    # [N, L] the target token's turn (-1 on padding)
    start: int = 0                        # targets are input_ids[:, start + 1:], so L = T - 1 - start
    owner: torch.Tensor | None = None     # [N] the episode each row belongs to
    is_teacher: torch.Tensor | None = None  # [N] bool: rows a teacher wrote (RIL's group)

    @property
    def n(self) -> int:
        return self.loss_mask.shape[0]

    def to(self, device: torch.device) -> "Trajectory":
        move = (lambda t: None if t is None else t.to(device))
        return Trajectory({k: v.to(device) for k, v in self.inputs.items()}, self.loss_mask.to(device),
                          self.turn.to(device), self.start, move(self.owner), move(self.is_teacher))


def from_completions(c: Completions, prompt_inputs: dict[str, torch.Tensor], processor,
                     is_teacher: torch.Tensor | None = None) -> Trajectory:
    """Answers to prompts as one-turn episodes. `prompt_inputs`: the model inputs of the N prompts (row i is
    completion i's prompt, left-padded to P), whose vision and per-token inputs carry over to the whole row."""
    mask = c.completion_mask  # [N, L]
    return Trajectory(processor.extend_inputs(prompt_inputs, c.sequences, mask), mask,
                      torch.where(mask.bool(), 0, -1), start=c.prompt_len - 1,
                      owner=torch.arange(mask.shape[0], device=mask.device), is_teacher=is_teacher)


def token_logprobs(model, traj: Trajectory, with_entropy: bool = False):
    """log pi(x_{t+1} | x_<=t) at every scored position: [N, L] (and the entropy there, [N, L])."""
    return logprobs_from_logits(model(**traj.inputs, use_cache=False).logits, traj, with_entropy)


def logprobs_from_logits(logits: torch.Tensor, traj: Trajectory, with_entropy: bool = False):
    """The scored positions of a forward's logits [N, T, V]: log pi of each target [N, L] (and the entropy)."""
    logp_all = torch.log_softmax(logits[:, traj.start:-1].float(), dim=-1)  # [N, L, V]
    targets = traj.inputs["input_ids"][:, traj.start + 1:]  # [N, L]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def thought_sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the masked tokens, mean over them: the agent warm start on the solver's turns, and
    GTR-Turbo's SFT guidance on the merged teacher's thought tokens.

    logp: [N, L] the policy's log-probs of the teacher's tokens; mask: [N, L] 1 on thought tokens (the
    action's tokens and everything else 0) -> scalar.
    """
    return -(logp * mask).sum() / mask.sum().clamp(min=1)
