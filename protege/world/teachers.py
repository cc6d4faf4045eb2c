"""Two scripted teachers with distinct verbal styles, standing in for large VLMs behind an API.

They see the ground truth (they are scripted), answer wrongly at `error_rate`, and vary their wording.
Each answer is a pure function of (teacher, question id, sample index, seed), so a cache is exact.
"""
from __future__ import annotations

import hashlib
import random

CONCISE = ["{a}.", "It is {a}.", "Answer: {a}.", "{a}"]
VERBOSE = {
    "count": ["Looking at the image, I count {a} shapes. So the answer is {a}.",
              "There are {a} shapes in the picture, so the answer is {a}."],
    "colour": ["All of the shapes are {a}. The answer is {a}.",
               "The shapes in the image are coloured {a}, so the answer is {a}."],
    "shape_option": ["The shape shown matches option {a}. The answer is {a}.",
                     "Comparing the picture with the options, the answer is {a}."],
    "chart_value": ["Reading the chart, that bar reaches {a}. The answer is {a}.",
                    "The bar in question has a height of {a}, so the answer is {a}."],
}
STYLES = ("concise", "verbose")


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def scripted_answer(teacher: str, kind: str, answer: str, candidates: list[str], item_id: str,
                    sample_index: int, error_rate: float, seed: int) -> str:
    if teacher not in STYLES:
        raise ValueError(f"unknown scripted teacher {teacher!r}; expected one of {STYLES}")
    rng = _rng(teacher, item_id, sample_index, seed)
    said = answer
    wrong = [c for c in candidates if c != answer]
    if wrong and rng.random() < error_rate:
        said = rng.choice(wrong)
    templates = CONCISE if teacher == "concise" else VERBOSE.get(kind, VERBOSE["count"])
    return rng.choice(templates).format(a=said)


def all_templates() -> list[str]:
    """Every phrase a teacher can say (for training the tokenizer on the world's text)."""
    return CONCISE + [t for ts in VERBOSE.values() for t in ts]
