"""Rule-based judge: does a free-form response state the reference answer?

It extracts the *last* candidate the response commits to (option letter, number or word), so a
response that lists several options or instructs the judge cannot talk its way into a match.
"""
from __future__ import annotations

import re

NUMBER_WORDS = {"zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
                "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_NUM = re.compile(r"-?\d+(?:[.,]\d+)*")


def _as_number(text: str) -> float | None:
    t = text.strip().lower().rstrip(".")
    t = NUMBER_WORDS.get(t, t).replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def extract(response: str, candidates: list[str]) -> str | None:
    """The last candidate mentioned in the response (whole words, letters case-sensitive), or None."""
    best, best_pos = None, -1
    for cand in candidates:
        if len(cand) == 1 and cand.isalpha() and cand.isupper():
            pattern = rf"(?<![A-Za-z]){re.escape(cand)}(?![A-Za-z])"  # an option letter, not inside a word
            flags = 0
        else:
            pattern = rf"(?<![\w.]){re.escape(cand)}(?![\w])"
            flags = re.IGNORECASE
        for m in re.finditer(pattern, response, flags):
            if m.start() > best_pos:
                best, best_pos = cand, m.start()
        if _as_number(cand) is not None:
            for word, digit in NUMBER_WORDS.items():
                if digit == cand:
                    for m in re.finditer(rf"\b{word}\b", response, re.IGNORECASE):
                        if m.start() > best_pos:
                            best, best_pos = cand, m.start()
    return best


def rule_judge(reference: str, response: str, candidates: list[str] | None = None, rel_tol: float = 1e-6) -> float:
    """1.0 if the response's answer matches the reference, else 0.0."""
    if candidates:
        return float(extract(response, candidates) == reference)
    ref_num = _as_number(reference)
    if ref_num is not None:
        found = _NUM.findall(response)
        if not found:
            return 0.0
        got = _as_number(found[-1])
        return float(got is not None and abs(got - ref_num) <= rel_tol * max(1.0, abs(ref_num)))
    norm = lambda s: re.sub(r"[^\w\s]", "", s.lower()).split()
    return float(norm(response) == norm(reference))
