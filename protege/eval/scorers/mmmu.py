"""MMMU and MMMU-Pro: option letters (A-J) for multiple choice, MMMU's open-answer matching otherwise."""
from __future__ import annotations

import ast
import re

from protege.errors import UserFacingError
from protege.bench.items import BenchItem, Scored
from protege.eval.scorers.base import as_float, numbers_in, words_to_digits
from protege.eval.scorers.multiple_choice import ChoiceScorer

_INDICATORS = ["could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result "]
_TRIVIAL = {":", ",", ".", "!", "?", ";", "'"}


def _key_tails(response: str) -> list[str]:
    """The shortest tail after an answer indicator in each sentence; the whole response if none."""
    resp = response.strip().strip(".").lower()
    parts = re.split(r"\.\s+|\n", resp)
    tails = []
    for i, part in enumerate(parts):
        indicators = _INDICATORS + (["="] if i == len(parts) - 1 else [])
        best = None
        for ind in indicators:
            if ind in part:
                tail = part.split(ind)[-1].strip()
                if best is None or len(tail) < len(best):
                    best = tail
        if best and best.strip() not in _TRIVIAL:
            tails.append(best)
    return tails or [resp]


def _normalized(value: str) -> list:
    """A number rounded to 2 decimals, else the lowercased string (a single character padded with a
    space on either side so 'a' does not match inside every word)."""
    value = value.strip()
    number = as_float(value)
    if number is not None:
        return [round(number, 2)]
    value = value.lower()
    return [" " + value, value + " "] if len(value) == 1 else [value]


def _golds(answer: str) -> list[str]:
    text = answer.strip()
    if text.startswith("[") and text.endswith("]"):
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, (list, tuple)):
            return [str(x) for x in parsed]
    return [text]


def open_match(response: str, answer: str) -> tuple[str, bool]:
    tails = _key_tails(words_to_digits(response))
    preds: list = []
    for p in tails + [n for t in tails for n in numbers_in(t)]:
        preds.extend(_normalized(p))
    golds = [g for a in _golds(answer) for g in _normalized(a)]
    for p in preds:
        if isinstance(p, str) and any(isinstance(g, str) and g in p for g in golds):
            return tails[-1], True
        if isinstance(p, float) and p in golds:
            return str(p), True
    return tails[-1], False


class MMMUScorer(ChoiceScorer):
    """lmms-eval `mmmu_val` (MMMU's own eval_utils).

    Multiple choice (options given or meta question_type 'multiple-choice'): `read_letter` with the
    last letter winning when several are named, as MMMU's parser takes the last-mentioned candidate;
    it also matches the option text. MMMU's parser reads any 'X ' (so 'I think' counts as option I) and
    picks a random letter when it finds none; we read 'I'/'A' before a lowercase word as English and
    score unreadable responses 0 with note "no option found".
    Open: the shortest tail after 'is', 'so', 'therefore', 'answer', ... (or '=' in the last sentence)
    of each sentence, plus the numbers in those tails; right if a normalised gold string is a substring
    of a tail, or a number (rounded to 2 decimals, commas dropped) equals a gold number. We also map
    number words ('five' -> 5) and split sentences on '. ' (MMMU's regex only splits on newlines
    because it lowercases first). The score is the mean over questions (micro). `complete` is ignored."""

    several = "last"

    def __init__(self, benchmark: str = "mmmu", protocol: str = "lmms-eval: MMMU eval_utils "
                 "(last option letter / open-answer tail and number matching)"):
        super().__init__(benchmark, protocol)

    def score_open(self, item: BenchItem, prediction: str) -> Scored:
        if item.meta.get("question_type") == "multiple-choice":
            raise UserFacingError(f"{item.where}: multiple-choice question without options")
        read, right = open_match(prediction, item.answer)
        return Scored(item.index, read, float(right))


class MMMUProScorer(MMMUScorer):
    """lmms-eval `mmmu_pro_standard` (10 options A-J): MMMU's multiple-choice parser, as in `MMMUScorer`
    (last letter named wins; no random fallback: unreadable -> 0, note "no option found")."""

    def __init__(self, benchmark: str = "mmmu_pro"):
        super().__init__(benchmark, "lmms-eval: mmmu_pro standard, MMMU multiple-choice parser (A-J)")
