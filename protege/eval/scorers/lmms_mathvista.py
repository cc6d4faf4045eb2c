"""MathVista under protocol `lmms-eval`: lmms-eval 0.7.3's `mathvista_process_results` rule path
(`MathVistaEvaluator.extract_answer`, `normalize_extracted_answer`, `safe_equal`), item by item, with
or without the GPT extraction step."""
from __future__ import annotations

import re

from protege.errors import UserFacingError
from protege.bench.items import BenchItem, Scored
from protege.eval.scorers.base import Completer, ItemScorer, ask, check_lengths
from protege.eval.scorers.harness_prompts import lmms_eval_prompt
from protege.eval.scorers.lmms_pipeline import lmms_response

_PAREN_LETTER = re.compile(r"\(([a-zA-Z])\)")
_JUDGE_ATTEMPTS = 5  # get_chat_response's patience: an empty reply is asked again
NO_JUDGE = "no judge: lmms-eval's extraction without GPT is ''"


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insert, delete, substitute; each costs 1)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def quick_extract(response: str, question_type: str, answer_type: str, choices: list[str]) -> str | None:
    """`extract_answer` before it asks GPT: '' for an empty response, the response itself when it is one
    of the choices (multi_choice), an int / float literal (integer / float); None = ask the judge."""
    if not response:
        return ""
    if question_type == "multi_choice" and response in choices:
        return response
    if answer_type == "integer":
        try:
            return str(int(response))
        except ValueError:
            pass
    if answer_type == "float":
        try:
            return str(float(response))
        except ValueError:
            pass
    return None


def normalize_extraction(extraction: str, choices: list[str], question_type: str, answer_type: str,
                         precision: int | None) -> str | None:
    """`normalize_extracted_answer`: multi_choice -> a choice text (the letter of '(X)' or a bare
    letter, else the choice nearest by edit distance, first on ties); integer -> str(int(float(x)));
    float -> str(round(float(x), precision)); list and text -> the string. None = not a number."""
    if question_type == "multi_choice":
        e = extraction.strip()
        letters = _PAREN_LETTER.findall(e)
        if letters:
            e = letters[0].upper()
        options = [chr(ord("A") + i) for i in range(len(choices))]
        if e in options:
            return choices[options.index(e)]
        distances = [edit_distance(e, c) for c in choices]
        return choices[distances.index(min(distances))]
    try:
        if answer_type == "integer":
            return str(int(float(extraction)))
        if answer_type == "float":
            # 0.7.3 passes the dataset's float precision (2.0) to round(), which raises and scores every
            # float question wrong; the evident fix is the integer the field means.
            return str(round(float(extraction), precision))
    except (ValueError, OverflowError, TypeError):
        return None
    return extraction


def safe_equal(prediction: str | None, answer: str) -> bool:
    # str(None) is "None": an unreadable number equals a gold written "None", as in lmms-eval
    return str(prediction).strip() == str(answer).strip()


def _precision(value) -> int | None:
    """The dataset's precision field (1.0, "2", 2) as the number of decimals it means."""
    try:
        return int(float(value)) if value not in (None, "") else None
    except (TypeError, ValueError, OverflowError):  # NaN / inf: a field left empty in a parquet file
        return None


class LmmsMathVistaScorer(ItemScorer):
    """lmms-eval 0.7.3 `mathvista_testmini_*` scoring (quick_extract off, as its yaml sets it).

    The response is taken as lmms-eval hands it over (`lmms_response`: reasoning blocks dropped,
    stripped); `quick_extract` takes empty, choice-text and plain-number answers; every other answer
    goes to `complete` with lmms-eval's own extraction prompt (its DEMO_PROMPT, read from the installed
    lmms-eval, then the item's `query`, the response and "Extracted answer: "); the reply, stripped, is
    the extraction (asked again up to five times while empty, then ''). Then `normalize_extraction` and
    `safe_equal` with the gold string.

    Without `complete`, lmms-eval's own path without its GPT: `get_chat_response` fails and returns '',
    so every answer `quick_extract` does not take is extracted as '' (note `NO_JUDGE`): a multi_choice
    question gets the choice nearest to '' (the shortest, the first on a tie), a number question None
    (wrong), list and text questions ''. Nothing more is read ("twelve", "12%", "b", "(C) 7" all fall
    there); protocol `lenient` reads them. Differences: precision (see `normalize_extraction`); files
    without MathVista's `query` field give the judge the question and choices as the query."""

    def __init__(self, benchmark: str = "mathvista"):
        super().__init__(benchmark, "lmms-eval: mathvista (0.7.3 extract_answer with its GPT extraction "
                                    "prompt, normalize_extracted_answer, safe_equal)")

    @staticmethod
    def spec(item: BenchItem) -> tuple[str, str, list[str], int | None]:
        qtype = item.meta.get("question_type") or ("multi_choice" if item.meta.get("choices") else "free_form")
        atype = item.meta.get("answer_type") or "text"
        choices = [str(c) for c in (item.meta.get("choices") or list(item.options.values()))]
        if qtype == "multi_choice" and not choices:
            raise UserFacingError(f"{item.where}: MathVista multi_choice question without choices")
        return qtype, atype, choices, _precision(item.meta.get("precision"))

    @staticmethod
    def query(item: BenchItem) -> str:
        if item.meta.get("query"):
            return str(item.meta["query"])
        qtype, _, choices, _ = LmmsMathVistaScorer.spec(item)
        text = f"Question: {item.question.strip()}"
        if item.meta.get("unit"):
            text += f" (Unit: {item.meta['unit']})"
        if qtype == "multi_choice":
            text += "\nChoices:\n" + "\n".join(f"({chr(ord('A') + i)}) {c}" for i, c in enumerate(choices))
        return text

    @staticmethod
    def judge_prompt(item: BenchItem, response: str) -> str:
        # lmms-eval's create_test_prompt
        return (f"{lmms_eval_prompt('mathvista').strip()}\n\n{LmmsMathVistaScorer.query(item)}\n\n{response}"
                "\n\nExtracted answer: ")

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        responses = [lmms_response(p) for p in predictions]
        found: list[tuple[str, str] | None] = []
        for item, response in zip(items, responses):
            qtype, atype, choices, _ = self.spec(item)
            e = quick_extract(response, qtype, atype, choices)
            found.append(None if e is None else (e, "" if e else "empty response"))
        pending = [i for i, f in enumerate(found) if f is None]
        if complete is None:
            for i in pending:
                found[i] = ("", NO_JUDGE)
        else:
            self._extract(items, responses, found, pending, complete)
        out = []
        for item, (e, note) in zip(items, found):
            qtype, atype, choices, precision = self.spec(item)
            normalized = normalize_extraction(e, choices, qtype, atype, precision)
            out.append(Scored(item.index, normalized or "", float(safe_equal(normalized, item.answer)), note))
        return out

    def _extract(self, items: list[BenchItem], responses: list[str], found: list, pending: list[int],
                 complete: Completer) -> None:
        """get_chat_response's patience: a prompt whose reply is empty is asked again, five asks in all."""
        prompts = {i: self.judge_prompt(items[i], responses[i]) for i in pending}
        for _ in range(_JUDGE_ATTEMPTS):
            for i, reply in zip(pending, ask(complete, [prompts[i] for i in pending])):
                if reply.strip():
                    found[i] = (reply.strip(), "llm extraction")
            pending = [i for i in pending if found[i] is None]
        for i in pending:
            found[i] = ("", "llm: empty reply")
