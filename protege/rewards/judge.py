"""Rule-based judge: does a response state the reference answer, once and without hedging?

The RL reward and the world accuracy both read answers through here, so a policy must not be able to
talk its way into credit. A careful grader's reading, as rules:

1. Text that asserts nothing is dropped: URLs and struck-through text (~~x~~, <s>, <del>, <strike>, and
   characters under a combining overlay such as U+0336 or U+0338: "B̸" is a struck-out B).
2. A refusal ("I don't know", "cannot tell", "无法", ...) earns nothing, whatever it mentions.
3. If the response states its answer explicitly ("the answer is", "Answer:", "final answer", "答案是"),
   only the text after each such marker, up to the end of its sentence, counts.
4. In that text every candidate mentioned counts as asserted unless a negation ("not", "n't", "no",
   "never", "except", "rather than", "instead of", "other than", "不是") stands before it in the same
   clause (clauses end at punctuation and at "but" / "however"). Option letters count as capital
   letters standing alone, not "A" / "I" as English words ("A cat", "I think"); numbers count by
   value, in digits or as words; other candidates case-insensitively as whole words, the longest
   candidate winning where two overlap. For a numeric question every number stated is a value.
5. Exactly one distinct candidate (or value) asserted is the answer; none or several (hedges such as
   "A or B" or "3 or 4", lists of options, every option) is no answer.

So listing every option, or every plausible value, never earns more than answering one.
"""
from __future__ import annotations

import re
import unicodedata

NUMBER_WORDS = {"zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
                "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
                "thirteen": "13", "fourteen": "14", "fifteen": "15", "sixteen": "16", "seventeen": "17",
                "eighteen": "18", "nineteen": "19", "twenty": "20"}

_NOT_ASSERTED = re.compile(r"https?://\S+|www\.\S+|~~.*?~~|<(s|del|strike)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_REFUSAL = re.compile(
    r"\b(?:i\s+(?:do\s+not|don't|dont)\s+know|not\s+sure|unsure|no\s+idea|"
    r"(?:can\s*not|can't|cannot|unable\s+to|impossible\s+to|no\s+way\s+to)\s+(?:tell|determine|answer|say|see|"
    r"know|decide|be\s+sure|identify|read|count)|i\s+(?:refuse|won't\s+answer|will\s+not\s+answer))\b"
    r"|无法|不知道|不确定|不清楚", re.IGNORECASE)
_MARKER = re.compile(r"(?:\bfinal\s+answer|\banswer\s+is|\banswer\s*[:：]|\banswer\s*=|答案\s*(?:是|为|：|:)|"
                     r"(?:^|(?<=[.!?。\n]))\s*(?:so|therefore|thus|hence|in\s+total|altogether)\b[,:]?)",
                     re.IGNORECASE)
# after the answer, a sentence that reopens it ("But it could also be C", "Just kidding, it is C")
_HEDGE_CUE = re.compile(r"\b(?:could|might|may|maybe|perhaps|possibly|or|alternatively|kidding|actually|also)\b",
                        re.IGNORECASE)
_LEAD = " \t\r\n*:：\"'"
_SENTENCE_END = re.compile(r"[.!?。！？](?=\s|$)|\n")
_CLAUSE_END = re.compile(r"[,;:.!?，。；：！？\n]|\bbut\b|\bhowever\b|但是|而是", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:not|no|never|neither|nor|except|excluding)\b|n't\b|\brather\s+than\b|"
                       r"\binstead\s+of\b|\bother\s+than\b|不是|并非|而非", re.IGNORECASE)
# a unit may follow ("3cm", "3个"); a digit or a decimal part may not
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?!\d|\.\d|,\d{3})")
_NUMBER_WORD = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)
_LETTER_VERBS = {"is", "was", "seems", "looks", "appears", "matches", "fits", "corresponds", "would", "should",
                 "must", "could", "might", "and", "or"}
_NEXT_WORD = re.compile(r"\s+([a-z]+)")


def _as_number(text: str) -> float | None:
    t = text.strip().lower().rstrip(".")
    t = NUMBER_WORDS.get(t, t).replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


# Unicode's canonical combining class 1 is "overlay" (U+0334-U+0338, U+20D2, U+20E5, ...): a mark drawn
# through its base character, which is how plain text strikes a character out
_OVERLAY = 1


def _drop_overlaid(text: str) -> str:
    """Each character carrying an overlay mark, with all its marks, becomes a space."""
    if not any(unicodedata.combining(ch) == _OVERLAY for ch in text):
        return text
    out: list[str] = []
    cluster: list[str] = []

    def flush() -> None:
        struck = any(unicodedata.combining(ch) == _OVERLAY for ch in cluster[1:])
        out.append(" " if struck else "".join(cluster))

    for ch in text:
        if cluster and unicodedata.combining(ch):
            cluster.append(ch)
            continue
        if cluster:
            flush()
        cluster = [ch]
    if cluster:
        flush()
    return "".join(out)


def strip_unasserted(text: str) -> str:
    """The text without URLs and struck-through parts, the Unicode minus read as '-'."""
    return _NOT_ASSERTED.sub(" ", _drop_overlaid(text)).replace("\u2212", "-")


def is_refusal(text: str) -> bool:
    return bool(_REFUSAL.search(text))


def _scope(response: str) -> tuple[str, str, bool] | None:
    """(the text whose mentions count, the text after the last stated answer, whether the answer was
    stated with a marker); None for a refusal. With markers, the scope is the sentence after each one,
    one per line."""
    text = strip_unasserted(response)
    if is_refusal(text):
        return None
    markers = list(_MARKER.finditer(text))
    if not markers:
        return text, "", False
    segments, rest = [], ""
    for m in markers:
        after = text[m.end():].lstrip(_LEAD)
        end = _SENTENCE_END.search(after)
        segments.append(after[:end.start()] if end else after)
        rest = after[end.end():] if end else ""
    return "\n".join(segments), rest, True


def negated(text: str, start: int) -> bool:
    """A negation stands before position `start` in its clause ("not C", "B, not A" for A)."""
    clause_start = max((m.end() for m in _CLAUSE_END.finditer(text, 0, start)), default=0)
    return any(m.end() <= start for m in _NEGATION.finditer(text, clause_start, start))


def _is_english_word(text: str, m: re.Match, stated: bool = False) -> bool:
    """"A cat", "I think": the article or pronoun, not an option; but never the first word after a
    stated answer ("The answer is A because ...")."""
    if m.group(0) not in ("A", "I"):
        return False
    if stated and (m.start() == 0 or text[m.start() - 1] == "\n"):
        return False
    nxt = _NEXT_WORD.match(text, m.end())
    return bool(nxt) and nxt.group(1) not in _LETTER_VERBS


def _mentions(text: str, candidates: list[str], stated: bool = False) -> list[tuple[int, int, str]]:
    """(start, end, candidate) for every mention, overlapping shorter mentions dropped. A lower-case
    letter counts only when it is all there is (the whole response, or all a stated answer says)."""
    numeric = bool(candidates) and all(_as_number(c) is not None for c in candidates)
    found: list[tuple[int, int, str]] = []
    if numeric:
        for m in _NUMBER.finditer(text):
            found.append((m.start(), m.end(), m.group(0)))
        for m in _NUMBER_WORD.finditer(text):
            found.append((m.start(), m.end(), NUMBER_WORDS[m.group(1).lower()]))
    else:
        for cand in candidates:
            if len(cand) == 1 and cand.isalpha() and cand.isupper():
                for m in re.finditer(rf"(?<![A-Za-z0-9]){re.escape(cand)}(?![A-Za-z0-9])", text):
                    if not _is_english_word(text, m, stated):
                        found.append((m.start(), m.end(), cand))
                for m in re.finditer(rf"(?m)^[\s*(\[]*({cand.lower()})[\s*)\].]*$", text):
                    found.append((m.start(1), m.end(1), cand))
            else:
                for m in re.finditer(rf"(?<![\w.]){re.escape(cand)}(?!\w)", text, re.IGNORECASE):
                    found.append((m.start(), m.end(), cand))
    found.sort(key=lambda f: (f[0], -(f[1] - f[0])))
    kept: list[tuple[int, int, str]] = []
    for f in found:
        if kept and f[0] < kept[-1][1]:
            continue
        kept.append(f)
    return kept


def _asserted(text: str, candidates: list[str], stated: bool = False) -> set[str]:
    values = set()
    for start, _, cand in _mentions(text, candidates, stated):
        if negated(text, start):
            continue
        number = _as_number(cand)
        values.add(repr(number) if number is not None else cand.lower())
    return values


def _reopened(rest: str, candidates: list[str], answer: set[str]) -> bool:
    """A sentence after the stated answer hedges towards another candidate."""
    for sentence in re.split(r"(?<=[.!?。！？])\s+|\n", rest):
        if _HEDGE_CUE.search(sentence) and _asserted(sentence, candidates) - answer:
            return True
    return False


def _values(response: str, candidates: list[str]) -> set[str] | None:
    """The distinct candidates (or numeric values) the response asserts; None for a refusal or a
    stated answer reopened by a later hedge."""
    scoped = _scope(response)
    if scoped is None:
        return None
    text, rest, stated = scoped
    asserted = _asserted(text, candidates, stated)
    if stated and rest and _reopened(rest, candidates, asserted):
        return None
    return asserted


def extract(response: str, candidates: list[str]) -> str | None:
    """The one candidate the response states, or None (nothing, several, a refusal)."""
    asserted = _values(response, candidates)
    if asserted is None or len(asserted) != 1:
        return None
    (only,) = asserted
    for cand in candidates:
        number = _as_number(cand)
        if (repr(number) if number is not None else cand.lower()) == only:
            return cand
    return None  # a numeric question answered with a value outside the candidates


def rule_judge(reference: str, response: str, candidates: list[str] | None = None, rel_tol: float = 1e-6) -> float:
    """1.0 if the response states the reference (and nothing else), else 0.0. Without candidates, a
    yes / no reference is judged against {yes, no} and a numeric one against every number stated."""
    if not candidates and reference.strip().lower() in ("yes", "no"):
        candidates = ["yes", "no"]
        reference = reference.strip().lower()
    if candidates:
        return float(extract(response, candidates) == reference)
    ref_num = _as_number(reference)
    if ref_num is not None:
        found = _values(response, [reference])
        values = {float(v) for v in found} if found is not None else set()
        if len(values) != 1:
            return 0.0
        (got,) = values
        return float(abs(got - ref_num) <= rel_tol * max(1.0, abs(ref_num)))

    scoped = _scope(response)
    if scoped is None:
        return 0.0

    def norm(s: str) -> list[str]:
        return re.sub(r"[^\w\s]", "", s.lower()).split()
    return float(norm(scoped[0]) == norm(reference) or norm(response) == norm(reference))
