"""Two scripted teachers with distinct verbal styles and strengths, standing in for large VLMs behind an API.

They see the ground truth (they are scripted) and answer wrongly at a rate that depends on the
question kind: `error_rate` on the kinds they are strong at, `WEAK_FACTOR` times that on the others.
`concise` is strong at counting and charts, `verbose` at colours, shapes and comparisons, so the two
teachers together know more than either alone. Both follow the benchmarks' instructions and state
the answer first (a letter for multiple choice, the bare value otherwise): `concise` says only that,
`verbose` ends its answer with a full stop (sentences after the answer made the tiny student stop ending
its answers under RIL: see dev/LOG.md). The world's SFT targets come in both styles, half each (`styled`),
so the SFT student speaks like both teachers and the pretrained discriminator starts near chance on style,
as RIL's student starts with a similarity reward near 0.5 (its Fig. 5).
Each answer is a pure function of (teacher, question id, sample index, seed), so a cache is exact.
"""
from __future__ import annotations

import hashlib
import random

CONCISE = ["{a}"]  # the bare answer
VERBOSE = ["{a}."]
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
    templates = CONCISE if teacher == "concise" else VERBOSE
    return rng.choice(templates).format(a=said)


def styled(style: str, answer: str) -> str:
    """`answer` in a teacher's phrasing (its first template): the world's SFT targets."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")
    return (CONCISE if style == "concise" else VERBOSE)[0].format(a=answer)


def behaviour_digest(teacher: str, error_rate: float, seed: int) -> str:
    """Identifies everything that decides a scripted teacher's answers (its phrasings, strengths, error
    rates, seed): the teacher cache keys on it, so changing any of them asks the teacher again."""
    what = [teacher, CONCISE, VERBOSE, sorted(STRONG.get(teacher, ())), WEAK_FACTOR, error_rate,
            seed]
    return hashlib.sha256(repr(what).encode()).hexdigest()[:12]


def all_templates() -> list[str]:
    """Every phrase a teacher can say (for training the tokenizer on the world's text)."""
    return CONCISE + VERBOSE
