"""MathVista: extract the final answer, normalise it by answer type, compare with the gold."""
from __future__ import annotations

import re

from protege.errors import UserFacingError
from protege.bench.items import BenchItem, Scored
from protege.eval.scorers.base import (
    Completer,
    ItemScorer,
    as_float,
    ask,
    check_lengths,
    drop_thousands,
    normalize_text,
    numbers_in,
    words_to_digits,
)
from protege.eval.scorers.letters import read_letter

EXTRACTION_PROMPT = """Copy the final answer out of a model's response to a math question. Write only the answer: \
a number, a Python list, or an option letter. If the response gives no answer, write NONE.

Question: How many cubes are left? (an integer)
Model response: There were 7 cubes and 2 were taken away, so 5 remain.
Extracted answer: 5

Question: What is the ratio of the short side to the long side? (a number with two decimals)
Model response: The sides are 3 and 4; dividing gives 0.75.
Extracted answer: 0.75

Question: Between which two years did sales peak? (a Python list)
Model response: Sales were highest from 2011 until 2012, then fell.
Extracted answer: [2011, 2012]

Question: Which shape is shaded? Choices: (A) circle (B) square (C) triangle
Model response: The shaded shape has three sides, so it is the triangle.
Extracted answer: C

Question: What is the value of x? (an integer)
Model response: I cannot read the figure.
Extracted answer: NONE

"""

_STATED_NUMBER = re.compile(r"(?i)answer\s*(?:is|:|=)?\s*:?\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?|-?\.\d+)")
_LIST = re.compile(r"\[[^\[\]]*\]")


def _letters(choices: list[str]) -> dict[str, str]:
    return {chr(ord("A") + i): str(c) for i, c in enumerate(choices)}


def _kind_hint(answer_type: str, precision: int | None) -> str:
    if answer_type == "integer":
        return "an integer"
    if answer_type == "float":
        return f"a number with {precision} decimals" if precision is not None else "a number"
    if answer_type == "list":
        return "a Python list"
    return "a short answer"


class MathVistaScorer(ItemScorer):
    """MathVista's own evaluator as lmms-eval runs it (`mathvista_evals.py`): extract the answer,
    normalise it (multi_choice: letter or choice text -> choice text; integer: int(float(x));
    float: round to `precision` decimals; list: the list), then compare with the gold string.

    Extraction is rules first: the whole response as a number or choice; an explicit "answer is X";
    the one number in the response; a letter or choice text read with `read_letter`; a [..] list.
    What the rules cannot decide goes to `complete` with our few-shot extraction prompt, in one batched
    call (lmms-eval sends every response that is not a bare value to GPT). Without `complete`, numeric
    questions take the last number in the response (note "last number") and the rest score 0.
    Differences: where MathVista maps an unreadable multi_choice answer to the closest choice by edit
    distance we score 0 (note "no choice found"); a float with no `precision` is compared at the
    gold's own number of decimals; lists are compared element-wise as numbers."""

    def __init__(self, benchmark: str = "mathvista"):
        super().__init__(benchmark, "lmms-eval: mathvista evaluator (extract, normalise by answer type, exact)")

    @staticmethod
    def _spec(item: BenchItem) -> tuple[str, str, int | None, list[str]]:
        qtype = item.meta.get("question_type") or ("multi_choice" if item.options or item.meta.get("choices")
                                                   else "free_form")
        atype = item.meta.get("answer_type") or ("text" if qtype == "multi_choice" else "")
        choices = list(item.meta.get("choices") or item.options.values())
        if qtype == "multi_choice" and not choices:
            raise UserFacingError(f"{item.where}: MathVista multi_choice question without choices")
        if qtype != "multi_choice" and atype not in ("integer", "float", "list", "text"):
            raise UserFacingError(f"{item.where}: MathVista answer_type {atype!r}; expected integer, float, "
                                  "list or text")
        precision = item.meta.get("precision")
        precision = int(float(precision)) if precision not in (None, "") else None
        return qtype, atype, precision, choices

    def _rule(self, item: BenchItem, response: str) -> tuple[str | None, str]:
        """(extraction, note); extraction None means undecided."""
        qtype, atype, _, choices = self._spec(item)
        text = response.strip()
        if not text:
            return "", "empty response"
        if qtype == "multi_choice":
            if text in choices:
                return text, ""
            letter, _ = read_letter(text, _letters(choices))
            return (letter, "") if letter else (None, "")
        if atype in ("integer", "float"):
            if as_float(text.rstrip(".")) is not None:
                return text.rstrip("."), ""
            stated = _STATED_NUMBER.findall(text)
            if stated:
                return stated[-1], ""
            nums = numbers_in(text) or numbers_in(words_to_digits(text))
            return (nums[0], "") if len(nums) == 1 else (None, "")
        if atype == "list":
            lists = _LIST.findall(text)
            return (lists[-1], "") if lists else (None, "")
        return text, ""

    def _fallback(self, item: BenchItem, response: str) -> tuple[str, str]:
        qtype, atype, _, _ = self._spec(item)
        if qtype == "multi_choice":
            return "", "no choice found"
        if atype in ("integer", "float"):
            nums = numbers_in(response) or numbers_in(words_to_digits(response))
            return (nums[-1], "last number") if nums else ("", "no number found")
        return "", "no answer found"

    def extraction_prompt(self, item: BenchItem, response: str) -> str:
        qtype, atype, precision, choices = self._spec(item)
        question = item.question.strip()
        if item.meta.get("unit"):
            question += f" (Unit: {item.meta['unit']})"
        if qtype == "multi_choice":
            question += " Choices: " + " ".join(f"({k}) {v}" for k, v in _letters(choices).items())
        else:
            question += f" ({_kind_hint(atype, precision)})"
        return f"{EXTRACTION_PROMPT}Question: {question}\nModel response: {response.strip()}\nExtracted answer:"

    def normalize(self, item: BenchItem, extraction: str) -> str | None:
        qtype, atype, precision, choices = self._spec(item)
        e = extraction.strip()
        if not e:
            return None
        if qtype == "multi_choice":
            options = _letters(choices)
            paren = re.search(r"\(([A-Za-z])\)", e)
            bare = paren.group(1).upper() if paren else e.strip(".:) ").upper()
            if bare in options:
                return options[bare]
            for c in choices:
                if normalize_text(c) == normalize_text(e):
                    return c
            letter, _ = read_letter(e, options)
            return options[letter] if letter else None
        if atype == "integer":
            value = as_float(e.rstrip("."))
            return str(int(value)) if value is not None else None
        if atype == "float":
            value = as_float(e.rstrip("."))
            if value is None:
                return None
            return str(round(value, precision)) if precision is not None else repr(value)
        if atype == "list":
            nums = numbers_in(e)
            return "[" + ", ".join(nums) + "]" if nums else None
        return e

    def equal(self, item: BenchItem, normalized: str | None) -> bool:
        if normalized is None:
            return False
        qtype, atype, precision, _ = self._spec(item)
        gold = item.answer.strip()
        if qtype == "multi_choice" or atype == "text":
            return normalized.strip() == gold or normalize_text(normalized) == normalize_text(gold)
        if atype == "integer":
            g = as_float(gold)
            return g is not None and int(g) == int(float(normalized))
        if atype == "float":
            g = as_float(gold)
            if g is None:
                return False
            places = precision if precision is not None else (len(gold.split(".")[1]) if "." in gold else 0)
            return round(float(normalized), places) == round(g, places)
        g_nums = [float(x) for x in numbers_in(gold)]
        p_nums = [float(x) for x in numbers_in(normalized)]
        if precision is not None:
            g_nums = [round(x, precision) for x in g_nums]
            p_nums = [round(x, precision) for x in p_nums]
        return bool(g_nums) and g_nums == p_nums

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        extractions: list[tuple[str, str] | None] = []
        undecided = []
        for i, (item, pred) in enumerate(zip(items, predictions)):
            e, note = self._rule(item, drop_thousands(pred or ""))
            extractions.append(None if e is None else (e, note))
            if e is None:
                undecided.append(i)
        if complete is not None:
            replies = ask(complete, [self.extraction_prompt(items[i], predictions[i] or "") for i in undecided])
            for i, reply in zip(undecided, replies):
                lines = [ln.strip() for ln in reply.strip().splitlines() if ln.strip()]
                first = lines[0] if lines else ""
                first = re.sub(r"(?i)^extracted answer:\s*", "", first)
                extractions[i] = ("", "llm: no answer") if first.upper() in ("", "NONE") else (first, "llm extraction")
        else:
            for i in undecided:
                extractions[i] = self._fallback(items[i], predictions[i] or "")
        out = []
        for item, (e, note) in zip(items, extractions):
            normalized = self.normalize(item, e)
            if normalized is None and e and not note:
                note = "no choice found" if self._spec(item)[0] == "multi_choice" else "not a valid answer"
            elif normalized is None and not note:
                note = "no choice found" if self._spec(item)[0] == "multi_choice" else "no answer found"
            out.append(Scored(item.index, normalized or "", float(self.equal(item, normalized)), note))
        return out
