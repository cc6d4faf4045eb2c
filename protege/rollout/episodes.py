"""Multi-turn episodes: many episodes generated at once, one observation (image and/or text) per turn.

An episode is one token sequence, in the chat template's layout: the first observation as a user turn,
then per turn the policy's output (through its end-of-turn token) and, unless the episode has ended, the
next observation as a new turn of its own role. Every token knows its turn; only tokens the policy wrote
are in the loss mask (an observation or a tool's output is attended to, never trained on), and each turn's
policy tokens are one span, so turn-level credit (GTPO) and thought/action masks (GTR-Turbo) can address them.

With `context="current"` the policy sees only the current observation each turn (a Markov policy, as in
RL4VLM / GTR on visual games): each turn is then a sequence of its own (`per_turn`), and the episode's
rows are those sequences; everything downstream addresses rows and their owning episode.

The environment side is a protocol: `reset(seed) -> Observation`, `step(text) -> StepResult` (the grid game
in protege.world.envs, and tool environments, implement it). Episodes of different lengths share a batch:
each round generates only for the episodes still running.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from PIL import Image

from protege.generation.row_seeds import row_seed
from protege.generation.transformers_backend import Sampling, complete
from protege.models.processor import StudentProcessor
from protege.rollout.trajectory import Trajectory


class Env(Protocol):
    def reset(self, seed: int) -> Any: ...  # an observation: `.text`, optional `.image`, optional `.role`

    def step(self, text: str) -> Any: ...  # `.observation`, `.reward`, `.done`, `.info`


@dataclass
class Episode:
    ids: list[int]                       # every token so far, image placeholders expanded
    loss_mask: list[int]                 # 1 on the policy's own tokens
    turn_of: list[int]                   # per token: the turn it belongs to (an observation opens its turn)
    images: list[Image.Image] = field(default_factory=list)   # in the order their placeholders appear
    image_at: list[int] = field(default_factory=list)          # per image: where its observation starts in ids
    spans: list[tuple[int, int]] = field(default_factory=list)  # per turn: [start, end) of the policy's tokens
    texts: list[str] = field(default_factory=list)             # per turn: the policy's output as text
    rewards: list[float] = field(default_factory=list)         # per turn
    infos: list[dict] = field(default_factory=list)            # per turn: what the environment reported
    done: bool = False
    truncated: bool = False              # ended by the length limit, not by the environment

    @property
    def turns(self) -> int:
        return len(self.spans) if self.per_turn is None else len(self.per_turn)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))

    @property
    def success(self) -> bool:
        return any(i.get("success", False) for i in self.infos)

    per_turn: list["Episode"] | None = None  # context "current": one single-turn sequence per turn

    def rows(self) -> list[tuple[list[int], list[int], list[int], list[Image.Image]]]:
        """The episode's training sequences: (ids, loss mask, turn per token, images) each."""
        if self.per_turn is None:
            return [(self.ids, self.loss_mask, self.turn_of, self.images)]
        return [(t.ids, t.loss_mask, [j] * len(t.ids), t.images) for j, t in enumerate(self.per_turn)]

    def prefix(self, turn: int) -> tuple[list[int], list[Image.Image]]:
        """`turn`'s context: the tokens before its policy output, with the images they hold."""
        if self.per_turn is not None:
            return self.per_turn[turn].prefix(0)
        start = self.spans[turn][0]
        return self.ids[:start], [im for im, at in zip(self.images, self.image_at) if at < start]


def observation_text(processor: StudentProcessor, text: str, n_images: int, role: str = "user",
                     first: bool = False) -> str:
    """One observation turn in the chat template's layout, ending with the assistant's header. The first
    one is the template's own prompt (always the user's: under context "current" a tool's output opens a
    sequence as its prompt); a later one is what the template writes after the previous end-of-turn."""
    if first:
        return processor.prompt(text, n_images)
    return processor.continuation(text, n_images, role)


def _observation_tokens(processor: StudentProcessor, obs, first: bool) -> tuple[list[int], list]:
    """(token ids with image placeholders expanded, images)."""
    image = getattr(obs, "image", None)
    images = [] if image is None else list(image) if isinstance(image, (list, tuple)) else [image]
    text = observation_text(processor, obs.text, len(images), getattr(obs, "role", "user") or "user", first)
    return processor.expand(text, images), images


def start_episode(processor: StudentProcessor, obs) -> Episode:
    ids, images = _observation_tokens(processor, obs, first=True)
    return Episode(ids=ids, loss_mask=[0] * len(ids), turn_of=[0] * len(ids), images=images,
                   image_at=[0] * len(images))


def add_policy_turn(ep: Episode, ids: list[int], text: str, eos_id: int) -> None:
    """The policy's output for the current turn; an output cut by the token limit gets its end-of-turn token
    appended (outside the loss: the policy did not write it) so the next observation follows a closed turn."""
    turn = len(ep.spans)
    start = len(ep.ids)
    ep.ids += ids
    ep.loss_mask += [1] * len(ids)
    ep.turn_of += [turn] * len(ids)
    ep.spans.append((start, len(ep.ids)))
    ep.texts.append(text)
    if not ids or ids[-1] != eos_id:
        ep.ids.append(eos_id)
        ep.loss_mask.append(0)
        ep.turn_of.append(turn)


def add_observation(processor: StudentProcessor, ep: Episode, obs) -> None:
    ids, images = _observation_tokens(processor, obs, first=False)
    ep.image_at += [len(ep.ids)] * len(images)
    ep.ids += ids
    ep.loss_mask += [0] * len(ids)
    ep.turn_of += [len(ep.spans)] * len(ids)
    ep.images += images


def prompt_batch(processor: StudentProcessor, prefixes: Sequence[tuple[list[int], list]]) -> dict[str, torch.Tensor]:
    """Left-padded generation inputs from (token ids, images) pairs."""
    return processor.assemble([ids for ids, _ in prefixes], [ims for _, ims in prefixes], padding_side="left")


CONTEXTS = ("full", "current")


def play(policy, processor: StudentProcessor, envs: Sequence[Env], seeds: Sequence[int], sampling: Sampling,
         max_tokens: int = 1024, device: torch.device | None = None,
         on_turn: Callable[[int, int], None] | None = None, context: str = "full",
         row_keys: Sequence[int] | None = None) -> list[Episode]:
    """Plays one episode per (env, seed), all at once: each round, every running episode gets one policy
    turn (one batched generation), then its environment's answer. `context`: `full` (the whole conversation
    so far) or `current` (only the current observation). `max_tokens` bounds an episode's length (the
    model's context): an episode that would pass it ends, marked `truncated`.
    `policy` may be a transformers model or a generation engine (see generation.complete). `row_keys` (one per
    episode): each turn draws from the episode's own stream (generation/row_seeds.py), whatever else is played
    beside it."""
    if context not in CONTEXTS:
        raise ValueError(f"unknown episode context {context!r}; expected one of {CONTEXTS}")
    eps = [start_episode(processor, env.reset(seed)) for env, seed in zip(envs, seeds)]
    current = {}  # context "current": the running episodes' current turn, a sequence of its own
    if context == "current":
        for i, ep in enumerate(eps):
            current[i], eps[i] = ep, Episode(ids=[], loss_mask=[], turn_of=[], per_turn=[])
    rnd = 0
    while running := [i for i, e in enumerate(eps) if not e.done]:
        seqs = [current.get(i, eps[i]) for i in running]
        batch = prompt_batch(processor, [(s.ids, s.images) for s in seqs])
        if device is not None:
            batch = {k: v.to(device) for k, v in batch.items()}
        turn_seeds = None if row_keys is None else [row_seed(row_keys[i], rnd) for i in running]
        out = complete(policy, processor, batch, [s.images for s in seqs], sampling, row_seeds=turn_seeds)
        for k, i in enumerate(running):
            ep, seq = eps[i], seqs[k]
            ids = out.sequences[k, out.prompt_len:][out.completion_mask[k].bool()].tolist()
            add_policy_turn(seq, ids, out.texts[k], processor.eos_token_id)
            if seq is not ep:
                ep.per_turn.append(seq)
                ep.texts.append(out.texts[k])
            res = envs[i].step(out.texts[k])
            ep.rewards.append(float(res.reward))
            ep.infos.append(dict(res.info))
            if res.done:
                ep.done = True
                continue
            if seq is not ep:
                current[i] = start_episode(processor, res.observation)
                continue
            add_observation(processor, ep, res.observation)
            if len(ep.ids) + sampling.max_new_tokens + 1 > max_tokens:
                ep.done = ep.truncated = True
        rnd += 1
        if on_turn:
            on_turn(rnd, len(running))
    return eps


def pack(processor: StudentProcessor, seqs: Sequence[tuple[list[int], list[int], list[int], list]]) -> Trajectory:
    """(ids, loss mask, turn per token, images) per row -> one trajectory, right-padded."""
    T = max(len(ids) for ids, *_ in seqs)
    N = len(seqs)
    mask = torch.zeros((N, T), dtype=torch.long)
    turn = torch.full((N, T), -1, dtype=torch.long)
    for i, (ids, lm, tn, _) in enumerate(seqs):
        mask[i, :len(ids)] = torch.tensor(lm)
        turn[i, :len(ids)] = torch.tensor(tn)
    images = [list(ims) for *_, ims in seqs]
    inputs = processor.assemble([ids for ids, *_ in seqs], images, padding_side="right")
    return Trajectory(inputs, mask[:, 1:], turn[:, 1:], images=images)


def pack_episodes(processor: StudentProcessor, eps: Sequence[Episode]) -> Trajectory:
    """Every row of every episode (one per episode, or one per turn under context "current")."""
    rows = [(r, i) for i, e in enumerate(eps) for r in e.rows()]
    batch = pack(processor, [r for r, _ in rows])
    batch.owner = torch.tensor([i for _, i in rows])
    return batch


def per_episode(row_sums: torch.Tensor, row_counts: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
    """Token-weighted means per episode from per-row sums and token counts: [N], [N], [N] -> [n]."""
    num = torch.zeros(n, dtype=row_sums.dtype, device=row_sums.device).index_add_(0, owner, row_sums)
    den = torch.zeros(n, dtype=row_sums.dtype, device=row_sums.device).index_add_(0, owner, row_counts)
    return num / den.clamp(min=1)
