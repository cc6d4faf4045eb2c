"""VLMEvalKit's multiple-choice answer matching (`can_infer`), written from its rules at one commit.

Followed: open-compass/VLMEvalKit `vlmeval/utils/matching_util.py` at commit
d21c5e969983dea6741a98eb2f7ec566ab82ee91 (the current rules: a letter counts only near the end of the
answer, "answer is X" is read case-insensitively, option texts are not searched in long answers).
The environment variable VERBOSE is taken as unset (VLMEvalKit's quantifier guard for "A" only runs
when it is set). The rules, in order:

1. An answer containing "Failed to obtain answer via API" skips the letter step.
2. One of VLMEvalKit's refusal sentences anywhere -> "Z" (no option: scored wrong).
3. '.()[],:;!*#{}' become spaces; the answer is split on whitespace. If exactly one option letter is
   a token, it counts when its first occurrence is among the last four tokens. If no option letter
   is a token and "Z" is one -> "Z".
4. Else the first "(correct) answer is X" (any case, X in A-D, optional '**' around it) whose
   upper-cased X is an option.
5. Else option-text matching: unless the answer is longer than twice the options' total length,
   exactly one option text (lower case) contained in the answer (lower case, no word boundaries).
"""
from __future__ import annotations

import re

REFUSALS = ("Sorry, I can't help with images of people yet.", "I can't process this file.",
            "I'm sorry, but without the image provided", "Cannot determine the answer")
API_FAILURE = "Failed to obtain answer via API"
_PUNCTUATION = ".()[],:;!*#{}"
_ANSWER_IS = re.compile(r"(?i)(?:correct\s+)?answer\s+is\s+\**([ABCD])\**")


def can_infer_option(answer: str, options: dict[str, str]) -> str | None:
    if API_FAILURE in answer:
        return None
    if any(r in answer for r in REFUSALS):
        return "Z"
    spaced = answer
    for c in _PUNCTUATION:
        spaced = spaced.replace(c, " ")
    tokens = spaced.split()
    named = [letter for letter in options if letter in tokens]
    if len(named) == 1:
        if tokens.index(named[0]) > len(tokens) - 5:
            return named[0]
    elif not named and "Z" in tokens:
        return "Z"
    m = _ANSWER_IS.search(answer)
    if m and m.group(1).upper() in options:
        return m.group(1).upper()
    return None


def can_infer_text(answer: str, options: dict[str, str]) -> str | None:
    low = answer.lower()
    if len(low) > 2 * sum(len(str(v)) for v in options.values()):
        return None
    hits = [letter for letter, text in options.items() if str(text).lower() in low]
    return hits[0] if len(hits) == 1 else None


def can_infer(answer: str, options: dict[str, str]) -> str | None:
    """An option letter, "Z" (refused / none), or None (nothing matched)."""
    answer = str(answer)
    return can_infer_option(answer, options) or can_infer_text(answer, options)
