"""Reading an option letter out of a free-form response.

Two readers (VLMEvalKit's current `can_infer` is in `vlmevalkit_match`):

* `read_letter` - ours, the `lenient` protocol's reader (MathVista and MMBench included).
  It reads what the model meant by explicit, documented rules; refusals, hedges between letters
  ("A or B"), negated letters ("not C"), URLs and struck-through text never count (as in the reward's
  rule judge):

  1. an explicit statement: "Answer: B", "The answer is (C)", "the option is b", "答案是B" (last one
     wins);
  2. a leading letter: "B", "b", "(B)", "[B]", "B.", "B)", "B:" at the very start (with the
     "last" policy it only counts as the first of the letters named);
  3. standalone capital letters among the options anywhere (not inside words: "Apple", "B-52",
     "I'm"); "A" and "I" followed by a lowercase word are read as English ("A cat", "I think")
     unless that word is a verb such as "is". Several different letters -> `several` policy:
     "reject" (no answer), "first" or "last";
  4. the option text: exactly one option's text appears in the response (as whole words).

  A letter read by rules 1-2 that is not among the options is "beyond options": no answer.

* `lmms_mmbench_letter` - lmms-eval 0.7.3's copy of an older VLMEvalKit matcher in its MMBench evaluator: bare letter
  tokens among A-E, with its guard that a bare "A" in a response of more than 3 tokens may be the
  article, then punctuated forms ("B.", "(B)", ":B", ...), then the option text.
"""
from __future__ import annotations

import re

from protege.eval.scorers.base import normalize_text
from protege.rewards.judge import is_refusal, negated, strip_unasserted

NO_OPTION = "no option found"

# "answer" may be followed directly by the letter; "option"/"choice" only through "is" or ":", so that
# "Option B is better than option C" is not read as a statement of C.
_VERB = r"(?i:is|would\s+be|should\s+be)"
_KEYWORD = (r"(?:(?i:\banswer\b)(?:\s+" + _VERB + r")?|(?i:\b(?:option|choice)\b)\s*(?:" + _VERB
            + r"|(?=[:：]))|答案(?:是|为)?)")
_EXPLICIT_UPPER = re.compile(_KEYWORD + r"\s*[:：]?\s*(?:\*\*)?[\(\[]?([A-Z])(?![A-Za-z0-9'’])")
_EXPLICIT_LOWER = re.compile(_KEYWORD + r"\s*[:：]?\s*(?:\(([a-z])\)|([a-z])(?=[.)]?\s*$))")
_LEADING = re.compile(r"^\s*(?:\*\*)?(?:\(([A-Za-z])\)|\[([A-Za-z])\]|([A-Za-z])(?:[.):：,]|\s*$))")
_TOKEN = re.compile(r"(?<![A-Za-z0-9'’_\-])([A-Z])(?![A-Za-z0-9'’_\-])")
_ENGLISH_WORD_LETTERS = {"A", "I"}
_LETTER_VERBS = {"is", "was", "would", "should", "seems", "appears", "matches", "fits", "and", "or", "looks"}
_NEXT_WORD = re.compile(r"\s+([a-z][a-z']*)")


def _first_group(m: re.Match) -> str:
    return next(g for g in m.groups() if g)


def _is_english_word(text: str, m: re.Match) -> bool:
    if m.group(1) not in _ENGLISH_WORD_LETTERS:
        return False
    nxt = _NEXT_WORD.match(text, m.end())
    return bool(nxt) and nxt.group(1) not in _LETTER_VERBS


def match_option_text(response: str, options: dict[str, str]) -> str | None:
    """The letter of the one option whose text appears (as whole words) in the response."""
    resp = f" {normalize_text(response)} "
    hits = {}
    for letter, text in options.items():
        norm = normalize_text(str(text))
        if norm and f" {norm} " in resp:
            hits[letter] = norm
    # "dark red" also contains the option "red": keep only the longest matches.
    hits = {k: v for k, v in hits.items() if not any(v != w and f" {v} " in f" {w} " for w in hits.values())}
    return next(iter(hits)) if len(hits) == 1 else None


_HEDGE = re.compile(r"(?<![A-Za-z0-9])([A-Z])\)?\s*(?:,|/|\bor\b|\band\b|或|或者|和)\s*"
                    r"(?:(?i:option|choice)\s+)?\(?([A-Z])(?![A-Za-z0-9])")


def read_letter(response: str, options: dict[str, str], several: str = "reject") -> tuple[str | None, str]:
    """(letter or None, note). The note is "" when a letter was read by rules 1-3.

    As the reward's rule judge does (protege.rewards.judge): URLs and struck-through text are not read,
    a refusal reads nothing, a hedge between two option letters ("A or B", "B/C", "A, B") reads nothing
    whatever the `several` policy, and a negated letter ("not C") is not a candidate."""
    letters = list(options)
    text = strip_unasserted(response).strip()
    if not text:
        return None, "empty response"
    if is_refusal(text):
        return None, "refusal"
    for m in _HEDGE.finditer(text):
        pair = {m.group(1), m.group(2)}
        if len(pair) == 2 and pair <= set(letters) and not negated(text, m.start(2)) and not negated(text, m.start(1)):
            return None, "hedge: " + " or ".join(sorted(pair))
    explicit = [(m.start(), _first_group(m).upper()) for rx in (_EXPLICIT_UPPER, _EXPLICIT_LOWER)
                for m in rx.finditer(text) if not negated(text, m.start())]
    if explicit:
        letter = max(explicit)[1]
        return (letter, "") if letter in letters else (None, f"letter {letter} beyond options")
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    m = _LEADING.match(text)
    if m:
        letter = _first_group(m).upper()
        if letter not in letters:
            return None, f"letter {letter} beyond options"
        if several != "last":
            return letter, ""
        first[letter] = last[letter] = 0  # "(A) is wrong, (C) is right": the last one named still wins
    for m in _TOKEN.finditer(text):
        if m.group(1) in letters and not _is_english_word(text, m) and not negated(text, m.start()):
            first.setdefault(m.group(1), m.start())
            last[m.group(1)] = m.start()
    if len(first) == 1:
        return next(iter(first)), ""
    if len(first) > 1:
        if several == "first":
            return min(first, key=first.get), ""
        if several == "last":
            return max(last, key=last.get), ""
        return None, "several letters: " + ", ".join(sorted(first))
    letter = match_option_text(text, options)
    if letter:
        return letter, "option text"
    return None, NO_OPTION


def _vlmevalkit_tokens(response: str) -> list[str]:
    for c in ".()[],:;!*#{}":
        response = response.replace(c, " ")
    return response.split()


def contained_option_text(response: str, options: dict[str, str]) -> str | None:
    low = response.lower()
    hits = [k for k, v in options.items() if str(v).lower() and str(v).lower() in low]
    return hits[0] if len(hits) == 1 else None


_MMBENCH_LETTERS = "ABCDE"  # can_infer_option's default num_choice=5
_MMBENCH_AFFIXES = [("", "."), ("", ","), ("", ":"), ("", ")"), ("", ")."), ("(", ")"), ("(", ")."),
                    (":", ""), (":", ","), (":", "."), (":", ")"), (":", ").")]


def lmms_mmbench_letter(response: str, options: dict[str, str]) -> str | None:
    """lmms-eval 0.7.3 `MMBench_Evaluator.can_infer`: bare letter tokens among A-E (whatever the question's
    options; a bare "A" in a response of more than three tokens stops this step), then the affixed forms
    ("B.", "(B)", ":B", ... one letter exactly), then exactly one option text contained (lower case).
    A response saying "Failed to obtain answer via API" skips the letter steps."""
    if "Failed to obtain answer via API" not in response:
        splits = [s.strip() for s in response.split()]
        bare = [c for c in _MMBENCH_LETTERS if c in splits]
        if len(bare) == 1 and not ("A" in splits and len(splits) > 3):
            return bare[0]
        for pre, suf in _MMBENCH_AFFIXES:
            hits = [c for c in _MMBENCH_LETTERS if pre + c + suf in splits]
            if len(hits) == 1:
                return hits[0]
    return contained_option_text(response, {k: v for k, v in options.items() if k in "ABCD"})


def options_line(options: dict[str, str]) -> str:
    return " ".join(f"{k}. {v}" for k, v in options.items())


def matching_prompt(question: str, options: dict[str, str], prediction: str) -> str:
    """Our wording of VLMEvalKit's answer-matching step (an LLM maps a free answer to a letter)."""
    return (
        "Match an answer to the options of a single-choice question. Reply with one uppercase letter: "
        "the option the answer means, or Z if the answer means none of them.\n\n"
        "Question: Which fruit is in the bowl?\nOptions: A. apple B. banana C. cherry D. grape\n"
        "Answer: it looks like a yellow banana\nLetter: B\n\n"
        "Question: Which fruit is in the bowl?\nOptions: A. apple B. banana C. cherry D. grape\n"
        "Answer: a loaf of bread\nLetter: Z\n\n"
        f"Question: {question.strip()}\nOptions: {options_line(options)}\nAnswer: {prediction.strip()}\nLetter:"
    )


def read_matching_reply(reply: str, options: dict[str, str]) -> str | None:
    splits = _vlmevalkit_tokens(reply)
    cands = [c for c in options if c in splits]
    return cands[0] if len(cands) == 1 else None


_QUESTION_OPTION = re.compile(r"(?:^|\n)\s*\(?([A-Z])[.)]\s+([^\n]+)")


def options_from_question(question: str) -> dict[str, str]:
    """Options written into the question text as 'A. text' / '(A) text' lines (RealWorldQA, BLINK)."""
    found = {m.group(1): m.group(2).strip() for m in _QUESTION_OPTION.finditer(question)}
    letters = list(found)
    expected = [chr(ord("A") + i) for i in range(len(letters))]
    return found if len(found) >= 2 and letters == expected else {}
