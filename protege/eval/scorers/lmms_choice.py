"""Benchmarks scored exactly as lmms-eval 0.7.3 scores them (the `lmms-eval` protocol): the plain
multiple-choice ones, MMMU / MMMU-Pro and ChartQA (MMBench's rule path lives in `circular`).

Each scorer names the task function it follows, rewritten from its rules, and sees the response as
that function does: after the task's filter chain, the reasoning blocks dropped and stripped
(`lmms_pipeline.lmms_response`). None asks an LLM (these tasks have no LLM step) and none guesses:
where the harness draws a random letter we score 0.
"""
from __future__ import annotations

import re
import string

from protege.errors import UserFacingError
from protege.bench.items import BenchItem, Scored
from protege.eval.scorers.base import Completer, ItemScorer, check_lengths
from protege.eval.scorers.lmms_mcq import lmms_mcq_letter
from protege.eval.scorers.lmms_pipeline import TaskFilter, ai2d_filter, lmms_response
from protege.eval.scorers.multiple_choice import gold_letter

ABCD = ("A", "B", "C", "D")


def _check_gold(item: BenchItem) -> None:
    """A gold that names no listed option is a broken file, whatever the harness would do with it."""
    if item.options:
        gold_letter(item, item.options)


def _letter_note(letter: str) -> str:
    return "" if letter else "no option found"


class PerItemScorer(ItemScorer):
    """A harness rule that looks at one question at a time: subclasses give `score_one`, which receives
    the response as lmms-eval hands it to the task (`task_filter` is the task's filter chain, None for
    lmms-eval's default `take_first`)."""

    task_filter: TaskFilter | None = None

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        return [self.score_one(item, lmms_response(pred, self.task_filter)) for item, pred in zip(items, predictions)]

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        raise NotImplementedError


class LmmsMMStarScorer(PerItemScorer):
    """lmms-eval 0.7.3 `mmstar_process_results` -> `exact_match`: the letter `extract_mcq_answer` reads
    among A-D equals the gold stripped and upper-cased. The average is `mmstar_aggregate_results`'s:
    the mean over L2 categories of their accuracies (macro)."""

    aggregate = "macro"

    def __init__(self, benchmark: str = "mmstar"):
        super().__init__(benchmark, "lmms-eval 0.7.3: mmstar exact_match (extract_mcq_answer, A-D), macro "
                                    "over L2 categories")

    def unit_category(self, item: BenchItem) -> str:
        return item.l2_category or item.category

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        _check_gold(item)
        letter = lmms_mcq_letter(prediction, ABCD)
        return Scored(item.index, letter, float(letter == item.answer.strip().upper()), _letter_note(letter))


class LmmsRealWorldQAScorer(PerItemScorer):
    """lmms-eval 0.7.3 `realworldqa_process_results`: a gold that is one of A-D (any case) is compared with
    the letter `extract_mcq_answer` reads among A-D; any other gold with the response lower-cased,
    stripped and with trailing periods removed, compared to the lower-cased gold (number words are not
    mapped to digits: "two" does not match "2")."""

    def __init__(self, benchmark: str = "realworldqa"):
        super().__init__(benchmark, "lmms-eval 0.7.3: realworldqa extract_mcq_answer for A-D golds, "
                                    "exact match otherwise")

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        gold = item.answer.strip()
        if gold.upper() in ABCD:
            letter = lmms_mcq_letter(prediction, ABCD)
            return Scored(item.index, letter, float(letter == gold.upper()), _letter_note(letter))
        said = prediction.lower().strip().rstrip(".")
        return Scored(item.index, said, float(said == gold.lower()))


_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _exact_match_text(text: str) -> str:
    """lmms-eval's exact_match with ignore_case and ignore_punctuation: lower case, ASCII punctuation
    removed, whitespace kept. It compares NumPy string arrays, which drop trailing NUL characters."""
    return text.lower().translate(_NO_PUNCTUATION).rstrip("\x00")


class LmmsAI2DScorer(PerItemScorer):
    """lmms-eval 0.7.3 `ai2d` (flexible-extract): `MultiChoiceRegexFilter` (`ai2d_filter`) keeps the letter
    of a leading 'X.' (upper case, after optional whitespace) and otherwise the whole response; the
    harness then drops reasoning blocks and strips it, and the `exact_match` metric compares it with the
    gold letter, ignoring case and ASCII punctuation but not inner whitespace: "(B)", "b.", " B" and
    "B\\n" match B; "B )" and "The answer is B" do not."""

    task_filter = staticmethod(ai2d_filter)

    def __init__(self, benchmark: str = "ai2d"):
        super().__init__(benchmark, "lmms-eval 0.7.3: ai2d MultiChoiceRegexFilter + exact_match "
                                    "(ignore case and punctuation)")

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        _check_gold(item)
        right = _exact_match_text(prediction) == _exact_match_text(item.answer)
        return Scored(item.index, prediction, float(right))


class LmmsSeedBenchScorer(PerItemScorer):
    """lmms-eval 0.7.3 `seedbench` / `seedbench_2_plus` (`seed_process_result`, `seed_aggregation_result`):
    the first character of the stripped response, compared with the gold case-insensitively after
    stripping both. "Apple" reads as A; "The answer is B" as T."""

    def __init__(self, benchmark: str):
        super().__init__(benchmark, f"lmms-eval 0.7.3: {benchmark} first character, case-insensitive")

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        _check_gold(item)
        said = prediction.strip()[:1]
        return Scored(item.index, said, float(said.lower().strip() == item.answer.lower().strip()))


def blink_letter(text: str, valid: str) -> str:
    """lmms-eval 0.7.3 `blink/_extract_answer_letter`, from its rules: (1) a first line of at most four
    characters that is only the letter, optionally in parentheses and followed by . : , ) or spaces;
    (2) the last "answer(s) (is) [:-] (X)" statement; (3) the last "(X)" in upper case; (4) the letter
    the text starts with, after "(" or spaces. Letters outside `valid` never count; (1), (2), (4) ignore
    case."""
    text = text.strip()
    letters = re.escape(valid.upper())
    first = text.split("\n", 1)[0].strip()
    if len(first) <= 4:
        m = re.match(rf"^\(?([{letters}])\)?[\.\s:,)]*$", first, flags=re.IGNORECASE)
        if m:
            return m.group(1).upper()
    stated = re.findall(rf"answers?(?:\s+is)?\s*[:\-]?\s*\(?([{letters}])\)?(?![A-Za-z])", text, flags=re.IGNORECASE)
    if stated:
        return stated[-1].upper()
    bracketed = re.findall(rf"\(([{letters}])\)", text)
    if bracketed:
        return bracketed[-1].upper()
    m = re.match(rf"[\(\s]*([{letters}])[\)\.\s]*", text, flags=re.IGNORECASE)
    return m.group(1).upper() if m else ""


class LmmsBlinkScorer(PerItemScorer):
    """lmms-eval 0.7.3 `blink_process_results`: `blink_letter` over the question's option letters (A..
    as many as it has choices; all of A-Z when it lists none) equals the gold with its parentheses
    stripped ("(B)" -> "B")."""

    def __init__(self, benchmark: str = "blink"):
        super().__init__(benchmark, "lmms-eval 0.7.3: blink _extract_answer_letter")

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        _check_gold(item)
        valid = string.ascii_uppercase[:len(item.options)] or string.ascii_uppercase
        letter = blink_letter(prediction, valid)
        return Scored(item.index, letter, float(letter == item.answer.strip("()")), _letter_note(letter))


_MMMU_EDGE = (",", ".", "!", "?", ";", ":", "'")


def mmmu_letter(response: str, options: dict[str, str]) -> str | None:
    """lmms-eval 0.7.3 `parse_mmmu_multi_choice_response` (MMMU's own parser), from its rules; None where
    it would draw a random letter. The response is stripped of , . ! ? ; : ' in turn and padded with
    spaces. Candidates, first stage that finds any: "(X)"; "X "; "X."; and, for responses of more than
    five words, options whose text appears (lower case). One candidate wins outright; among several,
    the one whose last "(X)" (bracket stage), last " X " (letter stages; -1 when absent) or last text
    occurrence (text stage) is latest, the first listed on a tie."""
    letters = list(options)
    text = response
    for ch in _MMMU_EDGE:
        text = text.strip(ch)
    text = f" {text} "
    bracketed = [c for c in letters if f"({c})" in text]
    cands, by_text = bracketed, False
    if not cands:
        cands = [c for c in letters if f"{c} " in text]
    if not cands:
        cands = [c for c in letters if f"{c}." in text]
    if not cands and len(text.split()) > 5:
        cands = [c for c in letters if str(options[c]).lower() in text.lower()]
        by_text = True
    if not cands:
        return None
    if by_text:
        starts = [text.lower().rfind(str(options[c]).lower()) for c in cands]
    elif bracketed:
        starts = [text.rfind(f"({c})") for c in cands]
    else:
        starts = [text.rfind(f" {c} ") for c in cands]
    return cands[starts.index(max(starts))]


_MMMU_KEYS = ("could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result ")
_MMMU_TRIVIAL = {":", ",", ".", "!", "?", ";", "'"}


def _mmmu_key_tails(response: str) -> list[str]:
    """The response stripped, '.'-stripped and lower-cased, split on newlines (the sentence split looks for
    a capital after lower-casing, so it never fires); per part, the shortest tail after any key phrase
    ('=' too in the last part); the whole text when no part has one."""
    text = response.strip().strip(".").lower()
    parts = re.split(r"\.\s(?=[A-Z])|\n", text)
    tails = []
    for i, part in enumerate(parts):
        keys = _MMMU_KEYS + (("=",) if i == len(parts) - 1 else ())
        best = None
        for key in keys:
            if key in part:
                tail = part.split(key)[-1].strip()
                if not best or len(tail) < len(best):  # an empty tail is replaced by the next one found
                    best = tail
        if best and best.strip() not in _MMMU_TRIVIAL:
            tails.append(best)
    return tails or [text]


def _mmmu_numbers(text: str) -> list[str]:
    """Numbers with thousands commas, then in scientific notation, then plain (MMMU's three patterns)."""
    return (re.findall(r"-?\b\d{1,3}(?:,\d{3})+\b", text) + re.findall(r"-?\d+(?:\.\d+)?[eE][+-]?\d+", text)
            + re.findall(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])", text))


def _mmmu_normalised(value: str) -> list:
    """A number (commas dropped) rounded to 2 decimals, else the lower-cased string; one character is
    padded with a space on either side so it does not match inside every word."""
    value = value.strip()
    try:
        return [round(float(value.replace(",", "")), 2)]
    except ValueError:
        value = value.lower()
        return [" " + value, value + " "] if len(value) == 1 else [value]


def mmmu_open_golds(item: BenchItem) -> list[str]:
    """The accepted answers of an open question. `eval_open` takes any element of a list gold
    (`isinstance(gold_i, list)`: each element through `normalize_str`), which reaches us as
    `meta["answers"]` (the reader's list-typed answer column) or as a list given for `item.answer`; an
    empty list accepts nothing, as there. A string gold stays one string, as lmms-eval keeps
    `doc["answer"]` (no literal_eval), even when it reads like a list ("['3', 'three']", as in the HF
    data): the harness then matches the literal text, so "three" is wrong; protocol `lenient` parses it."""
    listed = item.meta.get("answers")
    if not isinstance(listed, (list, tuple)):
        listed = item.answer
    if isinstance(listed, (list, tuple)):
        return [str(a) for a in listed]
    return [item.answer]


def mmmu_open_correct(response: str, golds: list[str]) -> tuple[str, bool]:
    """lmms-eval 0.7.3 MMMU open questions (`parse_open_response`, then `eval_open`), from their rules:
    the key tails and the numbers in them, normalised; right when a normalised string of any gold is
    inside a string prediction or a normalised number of any gold equals a number prediction."""
    tails = _mmmu_key_tails(response)
    preds = [p for raw in tails + [n for t in tails for n in _mmmu_numbers(t)] for p in _mmmu_normalised(raw)]
    golds = [g for gold in golds for g in _mmmu_normalised(gold)]
    for p in preds:
        if isinstance(p, str):
            if any(isinstance(g, str) and g in p for g in golds):
                return tails[-1], True
        elif p in golds:
            return tails[-1], True
    return tails[-1], False


class LmmsMMMUScorer(PerItemScorer):
    """lmms-eval 0.7.3 `mmmu_val` / `mmmu_pro_standard`: multiple choice by `mmmu_letter` against the gold
    letter (where lmms-eval would draw a random letter we score 0 with a note); open questions by
    `mmmu_open_correct` against every accepted answer (`mmmu_open_golds`)."""

    def __init__(self, benchmark: str = "mmmu"):
        super().__init__(benchmark, f"lmms-eval 0.7.3: {benchmark} parse_mmmu_multi_choice_response "
                                    "and parse_open_response / eval_open")

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        if not item.options:
            if item.meta.get("question_type") == "multiple-choice":
                raise UserFacingError(f"{item.where}: multiple-choice question without options")
            read, right = mmmu_open_correct(prediction, mmmu_open_golds(item))
            return Scored(item.index, read, float(right))
        _check_gold(item)
        letter = mmmu_letter(prediction, item.options)
        if letter is None:
            return Scored(item.index, "", 0.0, "no option found (lmms-eval draws a random letter)")
        return Scored(item.index, letter, float(letter == item.answer))


def lmms_relaxed_correctness(prediction: str, target: str, tolerance: float = 0.05) -> bool:
    """lmms-eval 0.7.3 `chartqa/relaxed_correctness`, from its rule: both strings read as floats as they
    stand (a trailing '%' run divides by 100; no stripping, no thousands separators) and the target is
    non-zero -> relative error within 5%; otherwise case-insensitive string equality."""
    def as_float(text: str) -> float | None:
        try:
            return float(text.rstrip("%")) / 100.0 if text.endswith("%") else float(text)
        except ValueError:
            return None

    p, t = as_float(prediction), as_float(target)
    if p is not None and t:
        return abs(p - t) / abs(t) <= tolerance
    return prediction.lower() == target.lower()


class LmmsChartQAScorer(PerItemScorer):
    """lmms-eval 0.7.3 `chartqa_process_results`: `lmms_relaxed_correctness` of the response (reasoning
    blocks dropped and stripped, as the harness hands it over: "45% " reads as 0.45) against the row's
    one gold answer. The `lenient` ChartQA scorer also drops thousands separators and a trailing period,
    and takes the best over several golds."""

    def __init__(self, benchmark: str = "chartqa"):
        super().__init__(benchmark, "lmms-eval 0.7.3: chartqa relaxed_correctness (5% numeric, else exact)")

    def score_one(self, item: BenchItem, prediction: str) -> Scored:
        return Scored(item.index, prediction, float(lmms_relaxed_correctness(prediction, item.answer)))
