"""Multiple-choice benchmarks scored exactly as lmms-eval 0.7.3 scores them (the `lmms-eval` protocol).

Each scorer names the task function it follows. They read letters with `lmms_mcq.lmms_mcq_letter`,
never ask an LLM (these tasks have no LLM step) and never guess.
"""
from __future__ import annotations

from protege.eval.items import BenchItem, Scored
from protege.eval.scorers.base import Completer, ItemScorer, check_lengths
from protege.eval.scorers.lmms_mcq import lmms_mcq_letter

ABCD = ("A", "B", "C", "D")


def _letter_note(letter: str) -> str:
    return "" if letter else "no option found"


class LmmsMMStarScorer(ItemScorer):
    """lmms-eval 0.7.3 `mmstar_process_results` -> `exact_match`: the letter `extract_mcq_answer` reads
    among A-D equals the gold stripped and upper-cased. The average is `mmstar_aggregate_results`'s:
    the mean over L2 categories of their accuracies (macro)."""

    aggregate = "macro"

    def __init__(self, benchmark: str = "mmstar"):
        super().__init__(benchmark, "lmms-eval 0.7.3: mmstar exact_match (extract_mcq_answer, A-D), macro "
                                    "over L2 categories")

    def unit_category(self, item: BenchItem) -> str:
        return item.l2_category or item.category

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        out = []
        for item, pred in zip(items, predictions):
            letter = lmms_mcq_letter(pred, ABCD)
            out.append(Scored(item.index, letter, float(letter == item.answer.strip().upper()), _letter_note(letter)))
        return out


class LmmsRealWorldQAScorer(ItemScorer):
    """lmms-eval 0.7.3 `realworldqa_process_results`: a gold that is one of A-D (any case) is compared with
    the letter `extract_mcq_answer` reads among A-D; any other gold with the response lower-cased,
    stripped and with trailing periods removed, compared to the lower-cased gold (number words are not
    mapped to digits: "two" does not match "2")."""

    def __init__(self, benchmark: str = "realworldqa"):
        super().__init__(benchmark, "lmms-eval 0.7.3: realworldqa extract_mcq_answer for A-D golds, "
                                    "exact match otherwise")

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        out = []
        for item, pred in zip(items, predictions):
            gold = item.answer.strip()
            if gold.upper() in ABCD:
                letter = lmms_mcq_letter(pred, ABCD)
                out.append(Scored(item.index, letter, float(letter == gold.upper()), _letter_note(letter)))
            else:
                said = (pred or "").lower().strip().rstrip(".")
                out.append(Scored(item.index, said, float(said == gold.lower())))
        return out
