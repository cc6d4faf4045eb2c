"""MM-Vet and MM-Vet v2: an LLM grader gives each answer a correctness score in [0, 1]."""
from __future__ import annotations

import re

from protege.bench.items import BenchItem, Scored
from protege.eval.scorers.base import (
    Completer,
    ItemScorer,
    ask,
    check_lengths,
    normalize_text,
    words_to_digits,
)
from protege.eval.scorers.harness_prompts import lmms_eval_prompt
from protege.eval.scorers.lmms_pipeline import lmms_response

GRADER_PROMPT = """Grade how correct an AI model's answer is, compared with the ground truth. In the ground truth, \
<AND> joins parts that must all appear in the answer for it to be fully right, and <OR> joins alternatives, any \
one of which makes it fully right. Partly right answers get partial credit. The correctness is one of 0.0 \
(wrong), 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9 or 1.0 (fully right). Reply with the correctness of the \
last row only.

Question | Ground truth | Prediction | Correctness
--- | --- | --- | ---
How many apples are on the plate? | 3 | There are three apples on the plate. | 1.0
How many apples are on the plate? | 3 | I count four apples. | 0.0
Which two cities are marked on the map? | Paris <AND> Berlin | Only Paris is marked. | 0.5
Which two cities are marked on the map? | Paris <AND> Berlin | Berlin and Paris are marked. | 1.0
Which two cities are marked on the map? | Paris <AND> Berlin | Paris and Rome. | 0.5
What is the man holding? | umbrella <OR> parasol | He is holding a parasol. | 1.0
What is the man holding? | umbrella <OR> parasol | A walking stick. | 0.0
Why is this cartoon funny? | The cat is scared of a tiny mouse although cats hunt mice: the roles are reversed. \
| It shows a cat and a mouse. | 0.2
Why is this cartoon funny? | The cat is scared of a tiny mouse although cats hunt mice: the roles are reversed. \
| The joke is the role reversal: a big cat runs from the small mouse it would normally chase. | 1.0
"""

RULE_NOTE = "rule judge: not comparable to published MM-Vet"
_SCORE = re.compile(r"(?:0(?:\.\d+)?|1(?:\.0+)?|\.\d+)")


def grader_prompt(item: BenchItem, prediction: str, prefix: str = GRADER_PROMPT) -> str:
    gold = item.answer.replace("<AND>", " <AND> ").replace("<OR>", " <OR> ")
    gold = " ".join(gold.split())
    return f"{prefix.rstrip()}\n{item.question.strip()} | {gold} | {prediction.strip()} |"


def parse_grade(reply: str) -> float | None:
    """The reply's first token as a float in [0, 1]; None for anything else ('0.5/1', 'high', '1.5')."""
    tokens = reply.strip().split()
    if not tokens:
        return None
    token = tokens[0].rstrip(".,;") if tokens[0] not in ("0.", "1.") else tokens[0][:-1]
    return float(token) if _SCORE.fullmatch(token) else None


def rule_grade(answer: str, prediction: str) -> float:
    """Without an LLM: 1.0 if the normalised answer (any <OR> alternative, or every <AND> part) appears
    as whole words in the prediction or equals it; 0.5 if some <AND> parts appear, or at least half the
    content words of a long (4+ word) answer; else 0.0."""
    pred = f" {normalize_text(words_to_digits(prediction))} "

    def present(part: str) -> bool:
        norm = normalize_text(words_to_digits(part))
        return bool(norm) and f" {norm} " in pred

    def grade_and(text: str) -> float:
        parts = [p for p in text.split("<AND>") if p.strip()]
        hits = sum(present(p) for p in parts)
        return 1.0 if parts and hits == len(parts) else 0.5 if hits else 0.0

    if "<OR>" in answer:
        return max(grade_and(alt) for alt in answer.split("<OR>") if alt.strip())
    if "<AND>" in answer:
        return grade_and(answer)
    if present(answer):
        return 1.0
    words = {w for w in normalize_text(answer).split() if len(w) > 3}
    if len(answer.split()) >= 4 and words:
        overlap = len(words & set(pred.split())) / len(words)
        return 0.5 if overlap >= 0.5 else 0.0
    return 0.0


def lmms_grader_prompt(item: BenchItem, prediction: str, prefix: str) -> str:
    """lmms-eval 0.7.3 `mmvet_process_results`' query: nothing stripped or collapsed beyond what the
    harness did to the response before (`lmms_response`)."""
    gold = item.answer.replace("<AND>", " <AND> ").replace("<OR>", " <OR> ")
    return f"{prefix}\n{item.question} | {gold} | {prediction} |"


def lmms_parse_grade(reply: str) -> float | None:
    """lmms-eval's reading of the grader's reply: the text before the first space, as Python's float(),
    accepted in [0, 1]. lmms-eval asks again forever when the number is outside [0, 1] or NaN (a reference
    bug); we treat it as unreadable."""
    token = reply.strip().split(" ")[0].strip()
    try:
        value = float(token)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


_GRADER_ATTEMPTS = 4  # lmms-eval's grades at temperatures 0, 0.5, 1.0 and 1.5; at 2.0 it gives 0
_PATIENCE = 3         # lmms-eval's get_chat_response: a blank reply is asked again, three asks in all
EMPTY_NOTE = "judge reply empty (scored 0, as lmms-eval does)"
UNUSABLE_NOTE = "judge reply unusable"


def _ask_patiently(complete: Completer, prompts: dict[int, str]) -> dict[int, str]:
    """`get_chat_response`: each prompt asked until its reply is not blank, three asks in all; the reply
    stripped, '' when all three were blank (or failed)."""
    got: dict[int, str] = {}
    pending = list(prompts)
    for _ in range(_PATIENCE):
        for i, reply in zip(pending, ask(complete, [prompts[i] for i in pending])):
            if reply.strip():
                got[i] = reply.strip()
        pending = [i for i in pending if i not in got]
        if not pending:
            break
    return {i: got.get(i, "") for i in prompts}


def lmms_grade_loop(complete: Completer, prompts: list[str]) -> list[tuple[float, str]]:
    """lmms-eval 0.7.3 `mmvet_process_results`' grading loop for every prompt, batched across prompts:
    a blank reply scores 0 at once; a grade that is not a number raises the temperature by 0.5 and asks
    once more, and that reply is dropped (the harness assigns it and then asks again at the top of its
    loop), so the next grade read is the one after it; at temperature 2.0 the item scores 0. Our judge
    always decodes greedily, so only the number of asks follows the temperature. A number outside
    [0, 1] or NaN is asked again (lmms-eval loops at the same temperature without end; we stop after
    `_GRADER_ATTEMPTS` grades and score 0)."""
    out: dict[int, tuple[float, str]] = {}
    asked = dict.fromkeys(range(len(prompts)), 0)
    pending = list(range(len(prompts)))
    while pending:
        replies = _ask_patiently(complete, {i: prompts[i] for i in pending})
        dropped, again = [], []
        for i in pending:
            asked[i] += 1
            if not replies[i]:
                out[i] = (0.0, EMPTY_NOTE)
                continue
            try:
                value = float(replies[i].split(" ")[0].strip())
            except ValueError:
                dropped.append(i)
                value = None
            if value is not None and 0.0 <= value <= 1.0:
                out[i] = (value, "judge")
            elif asked[i] >= _GRADER_ATTEMPTS:
                out[i] = (0.0, UNUSABLE_NOTE)
            else:
                again.append(i)
        if dropped:
            _ask_patiently(complete, {i: prompts[i] for i in dropped})
        pending = again
    return [out[i] for i in range(len(prompts))]


class MMVetScorer(ItemScorer):
    """MM-Vet (lmms-eval `mmvet`) / MM-Vet v2 (lmms-eval `mmvetv2`): a grader LLM completes a few-shot
    table 'question | ground truth | prediction | correctness'; correctness is a float in [0, 1] and the
    benchmark score the mean x 100 (the report scales). Units carry the item's category, else its
    capabilities.

    protocol "lmms-eval": lmms-eval 0.7.3's `mmvet_process_results` with its own MM_VET_PROMPT (read
    from the installed lmms-eval, see `harness_prompts`), its query layout (`lmms_grader_prompt`) and
    reply reading, and its grading loop with its retries (`lmms_grade_loop`: a blank reply scores 0, an
    unreadable grade is asked again twice, the first of the two replies dropped, up to temperature 2).
    protocol "lenient": protege's own wording of the grader (same scale and <AND>/<OR> rules) and
    `parse_grade`; an unparsable reply is asked again once, then scores 0.
    `grader_prompt` (evaluate.mmvet_grader_prompt, a user file) replaces the few-shot prefix under
    either protocol. With `complete` None, `rule_grade` scores instead and every item is noted
    "rule judge: not comparable to published MM-Vet" (lmms-eval itself would score 0 without its API)."""

    def __init__(self, benchmark: str = "mmvet", grader_prompt: str | None = None, protocol: str = "lmms-eval"):
        self.user_prefix = grader_prompt
        self.lmms = protocol == "lmms-eval"
        wording = ("MM-Vet's grader prompt (user file)" if grader_prompt else
                   "lmms-eval 0.7.3's MM_VET_PROMPT" if self.lmms else "protege's grader prompt")
        task = "mmvetv2" if benchmark == "mmvet_v2" else "mmvet"
        super().__init__(benchmark, f"{protocol}: {task} LLM grader, correctness 0.0-1.0 with <AND>/<OR>, "
                                    f"{wording}")

    def unit_category(self, item: BenchItem) -> str:
        caps = item.meta.get("capability") or []
        return item.category or (",".join(caps) if isinstance(caps, list) else str(caps))

    def prompt(self, item: BenchItem, prediction: str) -> str:
        if self.lmms:
            return lmms_grader_prompt(item, prediction, self.user_prefix or lmms_eval_prompt(self.benchmark))
        return grader_prompt(item, prediction, self.user_prefix or GRADER_PROMPT)

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        # under lmms-eval the grader sees the response as the harness hands it over (stripped, no <think>)
        preds = [lmms_response(p) if self.lmms else p or "" for p in predictions]
        if complete is None:
            return [Scored(it.index, p.strip()[:200], rule_grade(it.answer, p), RULE_NOTE)
                    for it, p in zip(items, preds)]
        prompts = [self.prompt(it, p) for it, p in zip(items, preds)]
        if self.lmms:
            graded = lmms_grade_loop(complete, prompts)
            return [Scored(it.index, p.strip()[:200], g, note) for it, p, (g, note) in zip(items, preds, graded)]
        grades: list[float | None] = [None] * len(items)
        pending = list(range(len(items)))
        for _ in range(2):  # an unparsable grade is asked again once
            for i, reply in zip(pending, ask(complete, [prompts[i] for i in pending])):
                grades[i] = parse_grade(reply)
            pending = [i for i in pending if grades[i] is None]
        return [Scored(it.index, p.strip()[:200], g if g is not None else 0.0,
                       "judge" if g is not None else UNUSABLE_NOTE)
                for it, p, g in zip(items, preds, grades)]
