"""ChartQA relaxed accuracy."""
from __future__ import annotations

import math
import re

from protege.bench.items import BenchItem, Scored
from protege.eval.scorers.base import Completer, ItemScorer, check_lengths

_GROUPED_NUMBER = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?$")


def _clean(text: str) -> str:
    t = text.strip()
    if t.endswith(".") and not t.endswith(".."):
        t = t[:-1].strip()
    if _GROUPED_NUMBER.match(t):
        t = t.replace(",", "")
    return t


def _to_float(text: str) -> float | None:
    # lmms-eval's reading: a trailing '%' divides by 100, so '45%' is 0.45 and equals '0.45', not '45'.
    try:
        value = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def relaxed_match(prediction: str, target: str, tolerance: float = 0.05) -> bool:
    p, t = _clean(prediction), _clean(target)
    pf, tf = _to_float(p), _to_float(t)
    if pf is not None and tf:  # a zero target falls through to exact string match, as in lmms-eval
        return abs(pf - tf) / abs(tf) <= tolerance
    return p.lower() == t.lower()


class ChartQAScorer(ItemScorer):
    """lmms-eval `chartqa` relaxed accuracy (Pix2Struct/Qwen-VL `relaxed_correctness`): the whole
    response and the target both read as numbers -> right if within 5% relative error (a trailing '%'
    divides by 100: '45%' == '0.45' but '45%' != '45'); a zero target, or any non-number, needs an
    exact case-insensitive match. Best over `meta['answers']` when given, else `item.answer`.
    Two additions, both documented deviations: thousands separators are dropped ('1,234' == '1234';
    lmms-eval compares them as strings) and one trailing period is ignored ('Yes.' == 'yes').
    No LLM step: `complete` is ignored."""

    def __init__(self, benchmark: str = "chartqa"):
        super().__init__(benchmark, "lmms-eval: chartqa relaxed_correctness (5% numeric tolerance, else exact)")

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        out = []
        for item, pred in zip(items, predictions):
            answers = item.meta.get("answers") or [item.answer]
            if isinstance(answers, str):
                answers = [answers]
            right = any(relaxed_match(pred or "", str(a)) for a in answers)
            out.append(Scored(item.index, _clean(pred or ""), float(right)))
        return out
