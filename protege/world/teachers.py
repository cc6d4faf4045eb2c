"""Two scripted teachers with distinct verbal styles and strengths, standing in for large VLMs behind an API.

They see the ground truth (they are scripted) and answer wrongly at a rate that depends on the
question kind: `error_rate` on the kinds they are strong at, `WEAK_FACTOR` times that on the others.
`concise` is strong at counting and charts, `verbose` at colours, shapes and comparisons, so the two
teachers together know more than either alone. Both follow the benchmarks' instructions and state
the answer first (a letter for multiple choice, the bare value otherwise); they differ in what follows.
Each answer is a pure function of (teacher, question id, sample index, seed), so a cache is exact.
"""
from __future__ import annotations

import hashlib
import random

CONCISE = ["{a}"]  # the bare answer: what the student says, so only correctness tells them apart
VERBOSE = {
    "count": ["{a}. I count {a} shapes.", "{a}, there are {a} shapes."],
    "count_option": ["{a}. That option matches the count.", "{a}, by counting the shapes."],
    "colour": ["{a}. The shapes are {a}.", "{a}, all of them are {a}."],
    "shape": ["{a}. Every object is a {a}.", "{a}, judging by the outlines."],
    "shape_option": ["{a}. That option matches the shape.", "{a}, judging by the outline."],
    "chart_value": ["{a}. The bar reaches {a}.", "{a}, reading the bar height."],
    "chart_option": ["{a}. That option matches the bar.", "{a}, reading the bar height."],
    "yes_no": ["{a}. I checked colour and shape.", "{a}, judging by the picture."],
    "compare_two": ["{a}. That image has more shapes.", "{a}, by counting both images."],
}
DEFAULT_VERBOSE = ["{a}. That is what the image shows.", "{a}, judging by the image."]
STYLES = ("concise", "verbose")
STRONG = {"concise": {"count", "count_option", "chart_value", "chart_option"},
          "verbose": {"colour", "shape", "shape_option", "yes_no", "compare_two"}}
WEAK_FACTOR = 3.0


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def kind_error_rate(teacher: str, kind: str, error_rate: float) -> float:
    """How often `teacher` answers a `kind` question wrongly."""
    return error_rate if kind in STRONG[teacher] else min(1.0, WEAK_FACTOR * error_rate)


def scripted_answer(teacher: str, kind: str, answer: str, candidates: list[str], item_id: str,
                    sample_index: int, error_rate: float, seed: int) -> str:
    if teacher not in STYLES:
        raise ValueError(f"unknown scripted teacher {teacher!r}; expected one of {STYLES}")
    rng = _rng(teacher, item_id, sample_index, seed)
    said = answer
    wrong = [c for c in candidates if c != answer]
    if wrong and rng.random() < kind_error_rate(teacher, kind, error_rate):
        said = rng.choice(wrong)
    templates = CONCISE if teacher == "concise" else VERBOSE.get(kind, DEFAULT_VERBOSE)
    return rng.choice(templates).format(a=said)


def all_templates() -> list[str]:
    """Every phrase a teacher can say (for training the tokenizer on the world's text)."""
    return CONCISE + [t for ts in VERBOSE.values() for t in ts] + DEFAULT_VERBOSE
