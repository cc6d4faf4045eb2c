"""Whether a multi-turn policy's thoughts collapse: four figures of one step's sampled episodes, logged by the
agent loop every step (GTR-Turbo's "thought collapse": plain RL's thoughts grow repetitive and stop depending
on the state while the actions still get rewarded).

A turn's *thought* is its output before the action ("Action: ..."), as GTR-Turbo's KL guidance reads it
(`merged_teacher.thought_mask`); an output with no parseable action is all thought. Over the step's episodes:

- `thought_entropy`: the policy's mean entropy (nats) over the thought tokens only, from the same forward as
  the loop's `entropy`, which averages over every token the policy wrote (thought, action, end of turn).
- `distinct_thoughts_per_state`: turns that answered the same observation (the same state: the observation's
  tokens and the pixels of its images; under one layout the group's G plays all see its first board) are
  pooled; over the states seen by at least two turns of the step, the number of distinct thought strings
  (whitespace-stripped, exact) summed over those states, divided by the number of turns at them. 1: every
  sample of a state thought something different; 1/n: the n samples of every state wrote one thought.
  Absent when no state was seen twice.
- `thought_self_bleu`: per episode of at least two turns, the mean over its turns of the BLEU-4 of that turn's
  thought against the episode's other thoughts as references (`bleu`), then the mean over those episodes. 1:
  every turn repeats the same thought; near 0: the thoughts share no phrase. Absent when no episode has two
  turns.
- `thought_tokens`: mean thought length in tokens per policy turn.
"""
from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Hashable, Sequence

import torch

from protege.rl.guidance.merged_teacher import thought_mask
from protege.rollout.episodes import Episode
from protege.rollout.trajectory import Trajectory
from protege.world.envs import action_start

_WORD = re.compile(r"\w+|[^\w\s]")


def thought_of(text: str) -> str:
    """The thought of a turn's output: the text before its action, whitespace-stripped (all of it when the
    output has no parseable action)."""
    cut = action_start(text)
    return (text if cut is None else text[:cut]).strip()


def words(text: str) -> list[str]:
    """BLEU's tokens: lower-cased words and single punctuation marks ("Go up." -> go, up, .)."""
    return _WORD.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu(hypothesis: Sequence[str], references: Sequence[Sequence[str]], max_n: int = 4) -> float:
    """Sentence BLEU-4 of `hypothesis` against `references` (token lists), uniform weights:
    exp(mean_n log p_n) * BP. p_n: the hypothesis's n-grams, each counted at most as often as it occurs in the
    reference that has it most (clipping), over its n-gram count; for n >= 2 with add-one smoothing,
    p_n = (matches + 1) / (count + 1) (Lin and Och's BLEU+1, so one missing 4-gram does not zero a sentence);
    p_1 is never smoothed. BP = 1 when the hypothesis is longer than the reference closest in length (the
    shorter one on a tie), else exp(1 - r / c). 0 for an empty hypothesis, no reference, or no word in common."""
    c = len(hypothesis)
    if c == 0 or not references:
        return 0.0
    log_p = 0.0
    for n in range(1, max_n + 1):
        hyp = _ngrams(hypothesis, n)
        most: Counter = Counter()
        for ref in references:
            most |= _ngrams(ref, n)  # per n-gram the largest count in any one reference
        matches = sum(min(k, most[g]) for g, k in hyp.items())
        total = sum(hyp.values())
        if n == 1:
            if matches == 0:
                return 0.0
            log_p += math.log(matches / total)
        else:
            log_p += math.log((matches + 1) / (total + 1))
    r = min((len(ref) for ref in references), key=lambda length: (abs(length - c), length))
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * math.exp(log_p / max_n)


def self_bleu(thoughts: Sequence[str]) -> float | None:
    """Mean over the thoughts of the BLEU of each against all the others (None for fewer than two)."""
    if len(thoughts) < 2:
        return None
    toks = [words(t) for t in thoughts]
    return sum(bleu(t, toks[:i] + toks[i + 1:]) for i, t in enumerate(toks)) / len(toks)


def distinct_per_state(samples: Sequence[tuple[Hashable, str]]) -> float | None:
    """(state, thought) pairs -> distinct thoughts per state: over the states that occur at least twice, the
    sum of their numbers of distinct thoughts over the sum of their numbers of samples (None: no state twice)."""
    by_state: dict[Hashable, list[str]] = {}
    for state, thought in samples:
        by_state.setdefault(state, []).append(thought)
    repeated = [t for t in by_state.values() if len(t) > 1]
    if not repeated:
        return None
    return sum(len(set(t)) for t in repeated) / sum(len(t) for t in repeated)


def _image_key(image) -> str:
    return hashlib.sha1(f"{image.mode}{image.size}".encode() + image.tobytes()).hexdigest()


def observation_keys(ep: Episode) -> list[Hashable]:
    """Per turn of `ep`, the observation it answered: its tokens (from the end of the previous policy output,
    or the sequence's start, to this turn's output) and its images' pixels."""
    keys = []
    for j in range(ep.turns):
        if ep.per_turn is not None:  # context "current": the turn is a sequence of its own
            seq, lo, hi = ep.per_turn[j], 0, ep.per_turn[j].spans[0][0]
        else:
            seq, lo, hi = ep, (ep.spans[j - 1][1] if j else 0), ep.spans[j][0]
        images = [im for im, at in zip(seq.images, seq.image_at) if lo <= at < hi] if seq.image_at else seq.images
        keys.append((tuple(seq.ids[lo:hi]), tuple(_image_key(im) for im in images)))
    return keys


def thought_metrics(eps: Sequence[Episode], batch: Trajectory, entropy: torch.Tensor, processor) -> dict[str, float]:
    """The step's four thought figures (see the module's doc). `batch`: the episodes packed (pack_episodes);
    `entropy`: [N, L] the policy's entropy at its positions. A figure with nothing to measure is left out."""
    thought = thought_mask(batch, processor).to(entropy.device)  # [N, L]
    n_thought = float(thought.sum())
    turns = sum(e.turns for e in eps)
    out = {"thought_tokens": n_thought / max(turns, 1)}
    if n_thought > 0:
        out["thought_entropy"] = float((entropy * thought).sum() / n_thought)
    thoughts = [[thought_of(t) for t in e.texts] for e in eps]
    distinct = distinct_per_state([(k, t) for e, ts in zip(eps, thoughts) for k, t in zip(observation_keys(e), ts)])
    if distinct is not None:
        out["distinct_thoughts_per_state"] = distinct
    per_episode = [b for ts in thoughts if (b := self_bleu(ts)) is not None]
    if per_episode:
        out["thought_self_bleu"] = sum(per_episode) / len(per_episode)
    return out
