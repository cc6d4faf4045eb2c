"""Plain multiple choice (one unit per question): AI2D, MMStar, RealWorldQA, BLINK, SEED-Bench, SEED-Bench-2-Plus.

These are the `lenient` protocol's scorers (the `lmms-eval` protocol uses `lmms_choice`): every scorer reads the letter with `letters.read_letter` (several different
letters -> no answer, score 0) and never asks an LLM: lmms-eval has no LLM step for these tasks, so
`complete` is ignored. Where a harness would pick a random letter we score 0 with note "no option found".
"""
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
    normalize_text,
    words_to_digits,
)
from protege.eval.scorers.letters import (
    matching_prompt,
    options_from_question,
    read_letter,
)
from protege.eval.scorers.vlmevalkit_match import API_FAILURE, can_infer


def gold_letter(item: BenchItem, options: dict[str, str]) -> str:
    """The gold letter, '(A)' read as 'A' (BLINK writes its answers that way)."""
    gold = item.answer.strip().strip("()").strip().upper()
    if gold not in options:
        raise UserFacingError(f"{item.where}: gold answer {item.answer!r} is not one of the option letters "
                              f"{', '.join(options)}")
    return gold


class ChoiceScorer(ItemScorer):
    """Option-letter accuracy with `read_letter`; subclasses name the lmms-eval rule they stand in for."""

    several = "reject"

    def options_of(self, item: BenchItem) -> dict[str, str]:
        return item.options

    def score_open(self, item: BenchItem, prediction: str) -> Scored:
        raise UserFacingError(f"{item.where}: a {self.benchmark} question needs options (letter -> text); "
                              "this one has none")

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        out = []
        for item, pred in zip(items, predictions):
            options = self.options_of(item)
            if not options:
                out.append(self.score_open(item, pred or ""))
                continue
            gold = gold_letter(item, options)
            letter, note = read_letter(pred or "", options, self.several)
            out.append(Scored(item.index, letter or "", float(letter == gold), note))
        return out


class AI2DScorer(ChoiceScorer):
    """lmms-eval `ai2d`: exact match of the response (case and punctuation ignored) after taking the
    letter of a leading 'B.'. We read the letter with `read_letter`, which agrees on such responses and
    also reads 'Answer: B' or the option text, which lmms-eval scores 0."""


class MMStarScorer(ChoiceScorer):
    """MMStar, `lenient` protocol: `read_letter` (an older lmms-eval rule took the first character, or the
    one after '(', 'option ' or 'the answer is '); macro over the L2 categories as lmms-eval averages.
    The `lmms-eval` protocol uses `lmms_choice.LmmsMMStarScorer` (0.7.3's extract_mcq_answer)."""

    aggregate = "macro"

    def unit_category(self, item: BenchItem) -> str:
        return item.l2_category or item.category


class BlinkScorer(ChoiceScorer):
    """lmms-eval `blink`: a letter at the very start of the response ('(B)', 'B.', 'b') equals the gold
    '(B)' with its parentheses dropped. lmms-eval's regex also reads 'Apple' as A; `read_letter`
    does not."""


class SeedBenchScorer(ChoiceScorer):
    """lmms-eval `seedbench`: the first character of the stripped response equals the gold letter
    (case-sensitive). We agree on responses that start with the letter and read the rest with
    `read_letter`, never taking the first letter of a word."""


class SeedBench2PlusScorer(ChoiceScorer):
    """lmms-eval `seedbench_2_plus`: as SEED-Bench, first character, compared case-insensitively."""


class RealWorldQAScorer(ChoiceScorer):
    """RealWorldQA, `lenient` protocol: number words mapped to digits, the option text mapped to its letter
    (options parsed from 'A. text' lines in the question), then exact match ignoring case, punctuation
    and a trailing period. Multiple-choice questions (options given, or written in the question text)
    are read with `read_letter`. Open questions (yes/no, counts) compare the normalised response with
    the gold; we also accept the response's first word ('Yes, it is.' / '3 cars') and an explicit
    'the answer is X'. lmms-eval 0.7.3 does none of this: `lmms_choice.LmmsRealWorldQAScorer`."""

    def options_of(self, item: BenchItem) -> dict[str, str]:
        if item.options:
            return item.options
        options = options_from_question(item.question)
        gold = item.answer.strip().strip("()").strip().upper()
        return options if gold in options else {}

    def score_open(self, item: BenchItem, prediction: str) -> Scored:
        read, ok = open_answer(prediction, item.answer)
        return Scored(item.index, read, float(ok))


_STATED = re.compile(r"(?i)\banswer\s*(?:is|:)\s*(.+)$")


def open_answer(prediction: str, gold: str) -> tuple[str, bool]:
    """(what was read, equal?) for short open answers: whole response, its first word, or 'answer is X'."""
    g = normalize_text(words_to_digits(gold))
    resp = normalize_text(words_to_digits(prediction))
    if not resp:
        return "", False
    stated = _STATED.search(words_to_digits(prediction))
    candidates = [resp, resp.split()[0]]
    if stated:
        said = normalize_text(stated.group(1))
        candidates += [said, said.split()[0] if said else ""]
    for cand in candidates:
        if cand == g or (as_float(cand) is not None and as_float(cand) == as_float(g)):
            return cand, True
    return candidates[-1] if stated else resp, False


class VLMEvalKitChoiceScorer(ItemScorer):
    """VLMEvalKit multiple choice (`vlmevalkit_match.can_infer`, at the commit named there; then, with a
    judge, its matching step). "Z" (a refusal sentence, or a bare Z token) scores 0. Without a judge,
    an unmatched answer is "Z" as under VLMEvalKit's `exact_matching` (0, note "unmatched"); with one,
    protege's matching prompt (VLMEvalKit is not installed to read its own from) goes to `complete`, the
    reply is read by `can_infer`, up to three asks, after which VLMEvalKit draws a random letter and we
    score 0 (note "unmatched (VLMEvalKit draws a random letter)"). MMMU open questions become
    VLMEvalKit's two-option question (A = the gold answer, B = "Other Answers", gold A). Other
    questions without options (RealWorldQA open) are scored by `open_scorer`, the benchmark's lmms-eval
    rule. Overall accuracy is the plain mean over questions (micro)."""

    def __init__(self, benchmark: str, open_scorer: ItemScorer):
        super().__init__(benchmark, "vlmevalkit: can_infer (matching_util at d21c5e96) exact matching, "
                                    "LLM matching with a judge")
        self.open_scorer = open_scorer

    def options_of(self, item: BenchItem) -> tuple[dict[str, str], str]:
        """(options, gold letter); ({}, "") for a question VLMEvalKit does not score as multiple choice."""
        options = self.open_scorer.options_of(item) if isinstance(self.open_scorer, ChoiceScorer) else item.options
        if options:
            return options, gold_letter(item, options)
        if self.benchmark in ("mmmu", "mmmu_pro"):
            return {"A": item.answer, "B": "Other Answers"}, "A"
        return {}, ""

    def score(self, items: list[BenchItem], predictions: list[str],
              complete: Completer | None = None) -> list[Scored]:
        check_lengths(items, predictions, "predictions")
        out: list[Scored | None] = [None] * len(items)
        open_at, pending = [], []
        for i, (item, pred) in enumerate(zip(items, predictions)):
            options, gold = self.options_of(item)
            if not options:
                open_at.append(i)
                continue
            letter = can_infer(pred or "", options)
            if letter:
                out[i] = Scored(item.index, letter, float(letter == gold), "refused (Z)" if letter == "Z" else "")
            else:
                pending.append(i)
        if open_at:
            opened = self.open_scorer.score([items[i] for i in open_at], [predictions[i] for i in open_at],
                                            complete)
            for i, s in zip(open_at, opened):
                out[i] = s
        if complete is not None and pending:
            prompts = {i: matching_prompt(items[i].question, self.options_of(items[i])[0], predictions[i] or "")
                       for i in pending}
            for _ in range(3):
                for i, reply in zip(pending, ask(complete, [prompts[i] for i in pending])):
                    options, gold = self.options_of(items[i])
                    letter = None if API_FAILURE in reply else can_infer(reply, options)
                    if letter:
                        out[i] = Scored(items[i].index, letter, float(letter == gold), "llm match")
                pending = [i for i in pending if out[i] is None]
        note = "unmatched (VLMEvalKit draws a random letter)" if complete is not None else "unmatched"
        for i in pending:
            out[i] = Scored(items[i].index, "", 0.0, note)
        return [s for s in out if s is not None]
