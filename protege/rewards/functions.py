"""Reward functions named in `rl.rewards` (TRL's `reward_funcs`, verl's `custom_reward_function`).

Each entry is `package.module:function`, imported from the project folder when the stage starts, or `judge`
(`rl.judge`'s verdict, rule or LLM). The question loop calls each function once per step on its batch of
answers with keyword arguments

    questions: list[str]       the question of each answer
    references: list[str]      its reference answer
    responses: list[str]       the answer
    images: list               the question's image files as path strings, or None for images held in memory
    ids: list[str]             the question's id
    is_teacher: list[bool]     RIL's teacher answers in the group

and takes one float per answer back; the answer reward is the weighted sum. A function should be
deterministic given its inputs: a resumed run calls it again on the same answers and must reach the same
weights.
"""
from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from protege.data.rows import ImageFiles, Row
from protege.errors import UserFacingError

JUDGE = "judge"


@dataclass(frozen=True)
class RewardTerm:
    name: str                   # as rl.rewards names it
    weight: float
    function: Callable | None   # None: the judge


def load_rewards(specs: Sequence, root: Path | None = None) -> list[RewardTerm]:
    """The terms of `rl.rewards`, their functions imported; `root` (the project folder) goes on sys.path
    first, so a project's own modules import however the stage was launched."""
    if root is not None and specs and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return [RewardTerm(spec.function, spec.weight, None if spec.function == JUDGE else _imported(i, spec.function))
            for i, spec in enumerate(specs)]


def _imported(i: int, name: str) -> Callable:
    module, attr = name.split(":")
    where = f"rl.rewards[{i}]: {name}"
    try:
        found = importlib.import_module(module)
    except Exception as exc:  # the user's module may fail in any way while it runs
        raise UserFacingError(f"{where}: cannot import {module} ({_brief(exc)})") from None
    function = getattr(found, attr, None)
    if function is None:
        raise UserFacingError(f"{where}: module {module} ({getattr(found, '__file__', '?')}) has no {attr!r}")
    if not callable(function):
        raise UserFacingError(f"{where}: {attr} is a {type(function).__name__}, not a function")
    return function


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def image_files(row: Row) -> list[str] | None:
    """A row's image paths; None for pixels in memory (a function is never handed decoded images)."""
    return [str(p) for p in row.source.paths()] if isinstance(row.source, ImageFiles) else None


def call(term: RewardTerm, owners: list[Row], responses: list[str], is_teacher: list[bool]) -> list[float]:
    """`term`'s function on every answer (`owners[k]` the question of `responses[k]`), checked: a reward that
    cannot be used stops the step naming the function."""
    n = len(responses)
    try:
        out = term.function(questions=[r.question for r in owners], references=[r.answer for r in owners],
                            responses=list(responses), images=[image_files(r) for r in owners],
                            ids=[r.id for r in owners], is_teacher=list(is_teacher))
    except Exception as exc:  # the user's code: its own error, named, without our frames around it
        raise UserFacingError(f"rl.rewards: {term.name} raised {_brief(exc)}") from exc
    try:
        values = [float(v) for v in out]
    except (TypeError, ValueError):
        raise UserFacingError(f"rl.rewards: {term.name} returned {type(out).__name__}, expected a sequence of {n} "
                              "floats (one per response)") from None
    if len(values) != n:
        raise UserFacingError(f"rl.rewards: {term.name} returned {len(values)} values for {n} responses")
    bad = next((k for k, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        raise UserFacingError(f"rl.rewards: {term.name} returned {values[bad]} for response {bad} "
                              f"({responses[bad][:60]!r}): a reward must be finite")
    return values


def weighted(terms: list[RewardTerm], raw: dict[str, list[float]]) -> list[float]:
    """sum of weight x output per answer; the first term starts the sum, so [judge x 1.0] is the judge's
    scores bit for bit."""
    totals = [terms[0].weight * v for v in raw[terms[0].name]]
    for term in terms[1:]:
        totals = [t + term.weight * v for t, v in zip(totals, raw[term.name])]
    return totals
