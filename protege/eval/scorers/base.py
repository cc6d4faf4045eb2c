"""What every benchmark scorer shares: the protocol it satisfies, per-item units, text and number helpers."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol

from protege.bench.items import BenchItem, Scored, Unit

# A text LLM: a batch of prompts in, one reply per prompt out (judge / extraction fallback).
Completer = Callable[[list[str]], list[str]]


class Scorer(Protocol):
    benchmark: str
    protocol: str   # one line: which harness rule it follows
    aggregate: str  # "micro" (mean over units) or "macro" (mean over categories of category means)

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]: ...

    def units(self, items: list[BenchItem], scored: list[Scored]) -> list[Unit]: ...


class ItemScorer:
    """One unit per question; subclasses implement `score`."""

    aggregate = "micro"

    def __init__(self, benchmark: str, protocol: str):
        self.benchmark = benchmark
        self.protocol = protocol

    def unit_category(self, item: BenchItem) -> str:
        return item.category

    def units(self, items: list[BenchItem], scored: list[Scored]) -> list[Unit]:
        check_lengths(items, scored, "scores")
        return [Unit(id=s.index, score=s.score, category=self.unit_category(it), difficulty=it.difficulty)
                for it, s in zip(items, scored)]


def check_lengths(items: list, other: list, what: str) -> None:
    # A caller bug (the generation loop lost or duplicated answers), not something a user can fix.
    if len(items) != len(other):
        raise ValueError(f"{len(items)} items but {len(other)} {what}")


def ask(complete: Completer, prompts: list[str]) -> list[str]:
    """One batched call; a completer that returns the wrong number of replies is a caller bug."""
    if not prompts:
        return []
    replies = list(complete(prompts))
    if len(replies) != len(prompts):
        raise ValueError(f"completer returned {len(replies)} replies for {len(prompts)} prompts")
    return [r if isinstance(r, str) else "" for r in replies]


NUMBER_WORDS = {"zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
                "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
                "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
                "eighteen": "18", "nineteen": "19", "twenty": "20"}
_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)
_THOUSANDS_RE = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])")


def words_to_digits(text: str) -> str:
    return _NUMBER_WORD_RE.sub(lambda m: NUMBER_WORDS[m.group(1).lower()], text)


def drop_thousands(text: str) -> str:
    """'1,234,567' -> '1234567', leaving list commas such as '1, 2' alone."""
    return _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), text)


NUMBER_RE = re.compile(r"-?(?:\d+\.\d+|\.\d+|\d+)(?:[eE][+-]?\d+)?")


def numbers_in(text: str) -> list[str]:
    return NUMBER_RE.findall(drop_thousands(text))


def as_float(text: str) -> float | None:
    try:
        return float(drop_thousands(text.strip()))
    except (ValueError, AttributeError):
        return None


def normalize_text(text: str) -> str:
    """Lowercase, punctuation to spaces, single spaces (keeps '-' and '.' inside numbers)."""
    t = text.lower().replace("\u2019", "'")
    t = re.sub(r"(?<!\d)[.](?!\d)|[^\w\s.\-]", " ", t)
    t = re.sub(r"(?<![\d\w])-(?!\d)", " ", t)
    return " ".join(t.split())
