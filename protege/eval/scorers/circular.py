"""MMBench / MMBench-CN CircularEval: a question counts only if every rotated copy is answered right."""
from __future__ import annotations

from protege.bench.items import BenchItem, Scored, Unit
from protege.eval.scorers.base import Completer, ask, check_lengths
from protege.eval.scorers.harness_prompts import lmms_eval_prompt
from protege.eval.scorers.letters import (
    lmms_mmbench_letter,
    matching_prompt,
    read_letter,
    read_matching_reply,
)
from protege.eval.scorers.lmms_mcq import lmms_mcq_letter
from protege.eval.scorers.lmms_pipeline import lmms_response
from protege.eval.scorers.multiple_choice import gold_letter
from protege.eval.scorers.vlmevalkit_match import API_FAILURE, can_infer


STATIC_NOTE = "static fallback (lmms-eval mmbench_en_dev_static: extract_mcq_answer)"


def group_key(item: BenchItem) -> str:
    return item.group or item.index


class CircularScorer:
    """CircularEval as both harnesses run it (lmms-eval's MMBench evaluator is a copy of VLMEvalKit's).

    Copies sharing `item.group` are rotations of one question. Each copy's letter is read by rule
    (lmms-eval: its `can_infer`, see `letters.lmms_mmbench_letter`; vlmevalkit: VLMEvalKit's current
    `can_infer`, see `vlmevalkit_match`; a refusal reads "Z", which is wrong). As in the
    harness, a group with a copy already read wrong is 0 without asking anything; the copies of the
    other groups that no rule could read go to `complete` with an answer-matching prompt, all in one
    batched call: under lmms-eval, 0.7.3's own `build_prompt` (read from the installed lmms-eval; the
    question without its hint, options A-D) and its `can_infer` on the reply, asked up to three times;
    under vlmevalkit, protege's wording and VLMEvalKit's `can_infer` on the reply, three times; under
    lenient, protege's wording, once. Where the harness then picks a random letter, we score the copy 0
    with note "unmatched". Under lmms-eval the responses are first taken as the harness hands them over
    (`lmms_response`: reasoning blocks dropped, stripped).
    With no `complete`, under lmms-eval: MMBench-EN follows `mmbench_en_dev_static` (its aggregation calls
    `eval_result(eval_method="static")`): the copies `can_infer` cannot read go to `extract_mcq_answer`
    among the filled options A-D ("**B**", "答案是B" read there); MMBench-CN has no static task, so it
    follows `mmbench_cn_dev` with its GPT unreachable: three failed API calls, then a random letter, so
    those copies score 0 with note "unmatched (lmms-eval draws a random letter)". Under vlmevalkit
    "unmatched" (its exact matching); under lenient, `read_letter` reads them. The summary's protocol
    line names the lmms-eval task the scoring matched.
    `units()` gives one unit per group (category and difficulty of the group's first copy); the
    benchmark score is the mean over groups (micro).
    """

    aggregate = "micro"

    def __init__(self, benchmark: str, protocol: str):
        self.benchmark = benchmark
        self._read = lmms_mmbench_letter if protocol in ("lmms-eval", "lenient") else can_infer
        self._protocol = protocol
        self._unmatched = {"lmms-eval": "unmatched (lmms-eval draws a random letter)",
                           "vlmevalkit": "unmatched (VLMEvalKit draws a random letter)"}.get(protocol, "unmatched")
        self.protocol = (f"{protocol}: MMBench CircularEval, rule letter matching then LLM matching; "
                         "group right only if all copies are")

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        if self._protocol == "lmms-eval":
            self.protocol = (f"lmms-eval: {self.harness_task(complete is not None)}, CircularEval; group right "
                             "only if all copies are")
        golds = [gold_letter(it, it.options) for it in items]
        if self._protocol == "lmms-eval":
            predictions = [lmms_response(p) for p in predictions]
        read = [self._read(p or "", it.options) for it, p in zip(items, predictions)]
        failed = {group_key(it) for it, r, g in zip(items, read, golds) if r is not None and r != g}
        notes = [""] * len(items)
        pending = [i for i, r in enumerate(read) if r is None and group_key(items[i]) not in failed]
        for i, r in enumerate(read):
            if r is None and group_key(items[i]) in failed:
                notes[i] = "not matched: another copy already wrong"
        if complete is not None and pending:
            prompts = {i: self._judge_prompt(items[i], predictions[i] or "") for i in pending}
            for _ in range(1 if self._protocol == "lenient" else 3):  # both harnesses ask three times
                for i, reply in zip(pending, ask(complete, [prompts[i] for i in pending])):
                    read[i] = self._read_reply(reply, items[i].options)
                    notes[i] = "llm match" if read[i] else self._unmatched
                pending = [i for i in pending if read[i] is None]
        elif self._protocol == "lenient":
            for i in pending:
                read[i] = read_letter(predictions[i] or "", items[i].options)[0]
                notes[i] = "rules-only fallback" if read[i] else "unmatched"
        elif self._protocol == "lmms-eval" and self.benchmark == "mmbench":
            # mmbench_en_dev_static: extract_mcq_answer among the filled options A-D where can_infer read nothing
            for i in pending:
                letters = sorted(k for k in items[i].options if k in "ABCD")
                read[i] = lmms_mcq_letter(predictions[i] or "", letters) or None
                notes[i] = STATIC_NOTE if read[i] else "unmatched (mmbench_en_dev_static: no letter found)"
        else:  # lmms-eval draws a letter after three failed API calls; VLMEvalKit's exact matching fails it
            for i in pending:
                notes[i] = self._unmatched if self._protocol == "lmms-eval" else "unmatched"
        return [Scored(it.index, r or "", float(r is not None and r == g), n)
                for it, r, g, n in zip(items, read, golds, notes)]

    def harness_task(self, judged: bool) -> str:
        """The lmms-eval task this scoring matches: with a judge the GPT-matching dev task; without one,
        MMBench-EN's static task (`mmbench_en_dev_static`), MMBench-CN's dev task with its API unreachable
        (it has no static task)."""
        if self.benchmark == "mmbench":
            return "mmbench_en_dev (can_infer, then the judge)" if judged else \
                "mmbench_en_dev_static (can_infer, then extract_mcq_answer)"
        return "mmbench_cn_dev (can_infer, then the judge)" if judged else \
            "mmbench_cn_dev (can_infer; no judge: lmms-eval draws a random letter)"

    def _judge_prompt(self, item: BenchItem, prediction: str) -> str:
        if self._protocol != "lmms-eval":
            return matching_prompt(f"{item.hint} {item.question}".strip(), item.options, prediction)
        # lmms-eval 0.7.3 MMBench_Evaluator.build_option_str / build_prompt: options A-D up to the first gap
        options = "There are several options: \n"
        for letter in "ABCD":
            if letter not in item.options:
                break
            options += f"{letter}. {item.options[letter]}\n"
        return lmms_eval_prompt("mmbench").format(item.question, options, prediction)

    def _read_reply(self, reply: str, options: dict[str, str]) -> str | None:
        if self._protocol == "vlmevalkit":
            return None if API_FAILURE in reply else can_infer(reply, options)
        if self._protocol == "lenient":
            return read_matching_reply(reply, options)
        return lmms_mmbench_letter(reply, {k: v for k, v in options.items() if k in "ABCD"})

    def units(self, items: list[BenchItem], scored: list[Scored]) -> list[Unit]:
        check_lengths(items, scored, "scores")
        groups: dict[str, list[tuple[BenchItem, Scored]]] = {}
        for it, s in zip(items, scored):
            groups.setdefault(group_key(it), []).append((it, s))
        units = []
        for key, members in groups.items():
            first = members[0][0]
            right = all(s.score >= 1.0 for _, s in members)
            units.append(Unit(id=key, score=float(right), category=first.category, difficulty=first.difficulty))
        return units
