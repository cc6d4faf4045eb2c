"""lmms-eval 0.7.3's multiple-choice letter reading (`lmms_eval/tasks/_task_utils/mcq_extract.py`,
`extract_mcq_answer`), rewritten from its rules. MMStar and RealWorldQA's lettered questions use it
under the `lmms-eval` protocol (MMBench does not: its default tasks never call it, see `circular`).

The rule, as that version applies it:
1. An empty or blank response reads as no letter.
2. The response is stripped of whitespace, then of each of , . ! ? ; : ' " in turn (one character
   class after the other, in that order), and padded with one space on each side.
3. Every choice letter (upper case only) is a candidate in each form it takes, at the position of its
   last occurrence: "(X)" parentheses, "X." period, "X:" colon, "X)" right paren, "X " space. These
   are substring tests, so "THE " holds an "E " candidate.
4. After the first occurrence of each answer phrase ("the answer is", "答案是", "选", ... matched in
   lower case), the first occurrence of each choice letter after it is a "phrase" candidate.
5. A choice letter the stripped text starts with (not followed by a letter) is a "start" candidate;
   one it ends with (not preceded by a letter) an "end" candidate.
6. Only when nothing was found: any occurrence of a choice letter, at its last position ("fallback").
7. The winner has the highest format priority (start 10, end 9, phrase 7, parentheses 6, period 5,
   colon 4, right paren 3, space 2, fallback 0), then the latest position.
"""
from __future__ import annotations

DEFAULT_CHOICES = ("A", "B", "C", "D", "E", "F", "G", "H")

ANSWER_PHRASES = (
    "the answer is", "answer is", "the correct answer is", "correct answer is", "the best answer is",
    "best answer is", "the correct option is", "correct option is", "the best option is", "best option is",
    "the choice is", "choice is", "the correct choice is", "correct choice is", "i choose", "i select",
    "i pick", "my answer is", "my choice is",
    "옵션", "정답은", "답은", "답:",  # Korean
    "答案是", "答案为", "选",  # Chinese
    "答えは",  # Japanese
)

PRIORITY = {"start": 10, "end": 9, "phrase": 7, "parentheses": 6, "period": 5, "colon": 4, "right_paren": 3,
            "space": 2, "fallback": 0}
_EDGE_PUNCTUATION = (",", ".", "!", "?", ";", ":", "'", '"')
_AFFIXED = (("({})", "parentheses"), ("{}.", "period"), ("{}:", "colon"), ("{})", "right_paren"),
            ("{} ", "space"))


def lmms_mcq_letter(response: str | None, choices: tuple[str, ...] | list[str] | None = None) -> str:
    """The letter lmms-eval 0.7.3 reads from `response` among `choices` (default A-H), or ""."""
    if not response or not response.strip():
        return ""
    letters = list(choices or DEFAULT_CHOICES)
    text = response.strip()
    for ch in _EDGE_PUNCTUATION:
        text = text.strip(ch)
    text = f" {text} "
    found: list[tuple[int, int, str]] = []  # (priority, position, letter)
    for form, name in _AFFIXED:
        for letter in letters:
            pos = text.rfind(form.format(letter))
            if pos >= 0:
                found.append((PRIORITY[name], pos, letter))
    lower = text.lower()
    for phrase in ANSWER_PHRASES:
        at = lower.find(phrase)
        if at >= 0:
            for letter in letters:
                pos = text.find(letter, at + len(phrase))
                if pos >= 0:
                    found.append((PRIORITY["phrase"], pos, letter))
    core = text.strip()
    for letter in letters:
        if core.startswith(letter) and (len(core) == 1 or not core[1].isalpha()):
            found.append((PRIORITY["start"], 0, letter))
        if core.endswith(letter) and (len(core) == 1 or not core[-2].isalpha()):
            found.append((PRIORITY["end"], len(text) - 1, letter))
    if not found:
        found = [(PRIORITY["fallback"], text.rfind(letter), letter) for letter in letters if letter in text]
    if not found:
        return ""
    # equal (priority, position) pairs name the same character, so they name the same letter
    return max(found, key=lambda f: (f[0], f[1]))[2]
