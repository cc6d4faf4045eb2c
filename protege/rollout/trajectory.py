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
from protege.models.logprobs import logprobs_from_logits as full_logprobs
from protege.models.logprobs import scored_positions
from protege.runtime.micro import rank_length_groups


@dataclass
class Trajectory:
    """Rows of token ids with what the update needs to know about each target token."""
    inputs: dict[str, torch.Tensor]       # input_ids / attention_mask [N, T] (+ the family's vision inputs)
    loss_mask: torch.Tensor               # [N, L] 1 where the target token is trained on (the policy's, a teacher's)
    turn: torch.Tensor                    # [N, L] the target token's turn (-1 on padding)
    start: int = 0                        # targets are input_ids[:, start + 1:], so L = T - 1 - start
    owner: torch.Tensor | None = None     # [N] the episode each row belongs to
    is_teacher: torch.Tensor | None = None  # [N] bool: rows a teacher wrote (RIL's group)
    images: list | None = None            # N lists: each row's images, in order (None: text only)

    @property
    def n(self) -> int:
        return self.loss_mask.shape[0]

    @property
    def width(self) -> int:
        """Tokens each row costs a forward (rows are padded to one width)."""
        return self.inputs["input_ids"].shape[1]

    def to(self, device: torch.device) -> "Trajectory":
        move = (lambda t: None if t is None else t.to(device))
        return Trajectory({k: v.to(device) for k, v in self.inputs.items()}, self.loss_mask.to(device),
                          self.turn.to(device), self.start, move(self.owner), move(self.is_teacher), self.images)

    def select(self, rows: list[int] | range, processor) -> "Trajectory":
        """The given rows (a micro-batch), vision inputs included; owners keep their whole-batch numbering."""
        rows = list(rows)
        images = self.images if self.images is not None else [[] for _ in range(self.n)]
        index = torch.tensor(rows, dtype=torch.long)
        pick = (lambda t: None if t is None else t[index.to(t.device)])
        return Trajectory(processor.select_rows(self.inputs, images, rows), pick(self.loss_mask), pick(self.turn),
                          self.start, pick(self.owner), pick(self.is_teacher), [images[r] for r in rows])

    def trimmed(self, processor) -> "Trajectory":
        """The same rows without the columns that are padding in every one of them: the trailing ones, and the
        leading ones before the first scored position (left-padded prompts). Padding is masked out of
        attention, so every scored position's log-prob is unchanged; a micro-batch of short rows then costs
        its own length, not the longest row of the whole batch."""
        attended = self.inputs["attention_mask"].bool().any(dim=0)  # [T]
        if not bool(attended.any()):
            return self
        cols = attended.nonzero().flatten()
        lo, hi = min(int(cols[0]), self.start), int(cols[-1]) + 1  # keep [lo, hi)
        hi = max(hi, self.start + 2)  # at least one scored position
        if lo == 0 and hi == self.width:
            return self
        L = hi - 1 - self.start  # scored positions kept
        if bool(self.loss_mask[:, L:].any()):
            raise ValueError("a scored token sits on a column no row attends to")
        keys = processor.row_keys()
        inputs = {k: (v[:, lo:hi] if k in keys else v) for k, v in self.inputs.items()}
        return Trajectory(inputs, self.loss_mask[:, :L], self.turn[:, :L], self.start - lo, self.owner,
                          self.is_teacher, self.images)


def length_parts(traj: Trajectory, tokens: int, processor,
                 agree: bool = False) -> tuple[list[Trajectory], list[list[int]]]:
    """`traj` as micro-batches of rows of like length (runtime.micro.length_groups), each trimmed to its own
    longest row, and the rows of `traj` each holds (ascending). A row's length is where it ends, counted from
    the batch's first kept column: behind a left-padded prompt two rows with as many tokens can span different
    columns, and counted so a group's trimmed width never exceeds its longest row's, so the budget holds.

    Trimming keeps scored position t at t (it cuts whole columns before the first and after the last), so a
    part's per-token tensors [n, L_i] are the first L_i columns of its rows' [N, L] ones: `join_parts`.
    `agree`: as many parts on every rank (runtime.micro.rank_length_groups; collective)."""
    attended = traj.inputs["attention_mask"].bool().cpu()
    ends = torch.where(attended, torch.arange(1, traj.width + 1), 0).amax(dim=1)  # [N]
    first = int(attended.any(dim=0).nonzero()[0]) if bool(attended.any()) else 0
    groups = [sorted(g) for g in rank_length_groups((ends - min(first, traj.start)).tolist(), tokens, agree)]
    parts = [(traj if len(g) == traj.n else traj.select(g, processor)).trimmed(processor) for g in groups]
    return parts, groups


def join_parts(pieces: list[torch.Tensor], rows: list, n: int, width: int) -> torch.Tensor:
    """Per-part per-token tensors [n_i, L_i] (`length_parts`; rows: a list of row indices or a slice each) as
    one [n, width] over the whole batch, 0 past a part's width (padding: no scored token there)."""
    out = pieces[0].new_zeros(n, width)
    for piece, r in zip(pieces, rows):
        out[r, :piece.shape[1]] = piece
    return out


def from_completions(c: Completions, prompt_inputs: dict[str, torch.Tensor], processor,
                     is_teacher: torch.Tensor | None = None, images: list | None = None) -> Trajectory:
    """Answers to prompts as one-turn episodes. `prompt_inputs`: the model inputs of the N prompts (row i is
    completion i's prompt, left-padded to P), whose vision and per-token inputs carry over to the whole row;
    `images`: row i's images (needed to split a batch with images into micro-batches)."""
    mask = c.completion_mask  # [N, L]
    return Trajectory(processor.extend_inputs(prompt_inputs, c.sequences, mask), mask,
                      torch.where(mask.bool(), 0, -1), start=c.prompt_len - 1,
                      owner=torch.arange(mask.shape[0], device=mask.device), is_teacher=is_teacher,
                      images=None if images is None else processor.image_lists(images))


def answer_trajectory(batch: dict[str, torch.Tensor], images: list) -> Trajectory:
    """Question + answer rows (processor.encode_pairs) as one-turn episodes whose targets are the answer tokens
    that some earlier position predicts. `images`: each row's images."""
    mask = batch["answer_mask"][:, 1:]  # [N, T-1]
    inputs = {k: v for k, v in batch.items() if k != "answer_mask"}
    return Trajectory(inputs, mask, torch.where(mask.bool(), 0, -1), start=0,
                      owner=torch.arange(mask.shape[0]), images=images)


@dataclass
class Scored:
    """One forward's view of a trajectory's scored positions (0 where the loss mask is 0)."""
    logp: torch.Tensor                   # [N, L] float32 log pi of each target token
    entropy: torch.Tensor | None = None  # [N, L] float32 entropy of pi there (detached: a metric)
    hidden: torch.Tensor | None = None   # [N, L, H] final hidden state each target is predicted from


def score(model, traj: Trajectory, *, with_entropy: bool = False, with_hidden: bool = False,
          temperature: float = 1.0) -> Scored:
    """log pi(x_{t+1} | x_<=t) at the scored positions (the loss mask), and the entropy there: the LM head runs
    on chunks of those positions only (models/logprobs.py), so a forward's memory is its activations, never
    [N, L, V]."""
    logp, entropy, hidden = scored_positions(model, traj.inputs, traj.start, traj.loss_mask.bool(),
                                             with_entropy=with_entropy, with_hidden=with_hidden,
                                             temperature=temperature)
    return Scored(logp, entropy, hidden)


def token_logprobs(model, traj: Trajectory, with_entropy: bool = False):
    """log pi(x_{t+1} | x_<=t) at the scored positions: [N, L] (and the entropy there, [N, L]); 0 elsewhere."""
    s = score(model, traj, with_entropy=with_entropy)
    return (s.logp, s.entropy) if with_entropy else s.logp


def logprobs_from_logits(logits: torch.Tensor, traj: Trajectory, with_entropy: bool = False):
    """The scored positions of a forward's logits [N, T, V]: log pi of each target [N, L] (and the entropy)."""
    return full_logprobs(logits[:, traj.start:-1], traj.inputs["input_ids"][:, traj.start + 1:], with_entropy)


def thought_sft_loss(logp: torch.Tensor, mask: torch.Tensor, tokens: float | None = None) -> torch.Tensor:
    """Cross-entropy on the masked tokens, mean over them: the agent warm start on the solver's turns, and
    GTR-Turbo's SFT guidance on the merged teacher's thought tokens.

    logp: [N, L] the policy's log-probs of the teacher's tokens; mask: [N, L] 1 on thought tokens (the
    action's tokens and everything else 0) -> scalar. For a micro-batch, `tokens` is the whole batch's count
    of masked tokens: the value is then this micro-batch's share of the whole batch's mean.
    """
    return -(logp * mask).sum() / (mask.sum().clamp(min=1) if tokens is None else max(float(tokens), 1.0))
