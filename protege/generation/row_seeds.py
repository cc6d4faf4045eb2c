"""Sampling whose draws belong to the prompt, not to the batch it happens to be in.

transformers' sampler draws every row's next token from one global generator, so a prompt's answer depends on
which other prompts share its batch and in what order. A run on 2 ranks (each sampling half the questions) would
then follow other answers than a run on one process, and a world size would be part of every result. Here each
answer draws from its own counter-based stream, keyed by (its prompt's seed, its sample index, the token
position): a question gets the same answers whether it is sampled alone, in a batch of 64, on rank 0 or rank 3.

The draw is exact: Gumbel-max over the warped logits (temperature, then top-k, then top-p, as transformers
applies them) picks token v with probability softmax(warped)[v]. The noise is a splitmix64 hash of the key
computed on the logits' device for the whole [rows, vocab] block, so no generator objects or loops over rows.
"""
from __future__ import annotations

import hashlib

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_ROWS_PER_CHUNK_ELEMENTS = 1 << 22  # bounds the [rows, vocab] noise block: 32 MiB per int64 temporary


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """A logical right shift of int64 (torch's >> keeps the sign)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser, in int64 arithmetic that wraps as uint64 does."""
    x = x ^ _shr(x, 30)
    x = x * _signed(_M1)
    x = x ^ _shr(x, 27)
    x = x * _signed(_M2)
    return x ^ _shr(x, 31)


def uniform(keys: torch.Tensor, position: int, vocab: int) -> torch.Tensor:
    """[R, V] float64 in (0, 1): a pure function of each row's key, the token position and the vocabulary index."""
    v = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    x = keys[:, None] + (position * vocab + v[None, :] + 1) * _signed(_GOLDEN)
    bits = _shr(_mix(_mix(x)), 11)  # the top 53 bits
    return (bits.double() + 0.5) / float(1 << 53)


def row_seed(*parts: int | str) -> int:
    """A 63-bit seed from a run's seed, a step and an item's index (or name): the same parts, the same seed."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class RowSeededSampler(LogitsProcessor):
    """Replaces transformers' sampling step: generate runs greedily over scores this processor has made one-hot
    at each row's own draw. `seeds[i]` keys prompt i; its `per_prompt` answers (num_return_sequences, in a row
    as generate repeats them) get their own streams."""

    def __init__(self, seeds: list[int], per_prompt: int, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0):
        keys = [row_seed(s, j) for s in seeds for j in range(per_prompt)]
        self.keys = torch.tensor(keys, dtype=torch.int64)  # row_seed's 63 bits fit a signed int64
        self.position = 0
        self.warpers = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_k:
            self.warpers.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != self.keys.shape[0]:
            raise ValueError(f"{scores.shape[0]} rows to sample but {self.keys.shape[0]} row seeds")
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        keys, vocab = self.keys.to(scores.device), scores.shape[1]
        step = max(1, _ROWS_PER_CHUNK_ELEMENTS // vocab)
        choice = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
        for i in range(0, scores.shape[0], step):
            gumbel = -torch.log(-torch.log(uniform(keys[i:i + step], self.position, vocab)))
            choice[i:i + step] = (scores[i:i + step].double() + gumbel).argmax(dim=1)
        self.position += 1
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, choice[:, None], 0.0)
