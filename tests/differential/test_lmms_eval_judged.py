"""Where lmms-eval 0.7.3 asks GPT (MMBench matching, MathVista extraction, the MM-Vet grader): the same
deterministic stand-in judge answers both lmms-eval's own functions (their API call patched) and our
`lmms-eval` protocol, which must send the same prompt text and reach the same score on every item."""
from __future__ import annotations

import hashlib
import itertools
import random

import pytest

from protege.eval.items import BenchItem
from protege.eval.scorers import scorer_for

pytest.importorskip("lmms_eval.tasks._task_utils.mcq_extract", reason="lmms-eval 0.7.3 is installed by `make test`")
pytest.importorskip("Levenshtein", reason="lmms-eval's MathVista evaluator needs it; `make test` installs it")


def stand_in(replies: list[str]):
    """A judge whose reply depends only on the prompt text. lmms-eval's API wrappers strip the reply
    (and retry an empty one inside the call we patch), so the patched calls strip it too."""
    def reply(prompt: str) -> str:
        return replies[int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % len(replies)]
    return reply


class Recorder:
    def __init__(self, judge):
        self.judge, self.prompts = judge, []

    def __call__(self, prompts: list[str]) -> list[str]:
        self.prompts.extend(prompts)
        return [self.judge(p) for p in prompts]


# --- MMBench: eval_sub_data with its GPT matcher ------------------------------------------------------

def test_mmbench_judged_matches_eval_sub_data(monkeypatch):
    import pandas as pd
    from lmms_eval.tasks.mmbench import mmbench_evals
    from lmms_eval.tasks.mmbench.mmbench_evals import MMBench_Evaluator

    judge = stand_in(["A", "B", "C", "D", "E", "The answer is B.", "nothing fits", "A and B", "(C)", "Option D"])
    theirs_prompts: list[str] = []
    monkeypatch.setattr(MMBench_Evaluator, "get_chat_response",
                        lambda self, prompt, **kw: theirs_prompts.append(prompt) or judge(prompt).strip())
    # the harness's random letter after three failed matches: "E", which is never the gold (we score 0)
    monkeypatch.setattr(mmbench_evals.rd, "randint", lambda lo, hi: hi)
    harness = MMBench_Evaluator()
    texts = ["apple", "banana", "cherry", "grape"]
    free = ["it is a fruit", "the yellow one", "I like apples", "a red fruit", "not sure", "cherry pie", "选香蕉",
            "Maybe the second", "B or C", "something round", "grapes are purple", "????"]
    rng = random.Random(7)
    items, preds = [], []
    for g in range(120):
        gold_text = rng.choice(texts)
        for k in range(4):
            opts = {letter: texts[(i + k) % 4] for i, letter in enumerate("ABCD")}
            gold = next(letter for letter, t in opts.items() if t == gold_text)
            items.append(BenchItem(benchmark="mmbench", index=str(g + k * 1_000_000), question="Which fruit is it?",
                                   images=[], answer=gold, options=opts, group=str(g)))
            preds.append(rng.choice([gold, rng.choice(free), rng.choice(free)]))
    ours_judge = Recorder(judge)
    scorer = scorer_for("mmbench")
    units = {u.id: u.score for u in scorer.units(items, scorer.score(items, preds, ours_judge))}
    bad = []
    for g in range(120):
        copies = [(it, p) for it, p in zip(items, preds) if it.group == str(g)]
        frame = pd.DataFrame([{"index": int(it.index), "prediction": p, "answer": it.answer, "question": it.question,
                               **it.options} for it, p in copies])
        theirs = harness.eval_sub_data(frame, {int(it.index): it.answer for it, _ in copies})
        if units[str(g)] != theirs:
            bad.append(f"group {g} {[(it.answer, p) for it, p in copies]}: ours {units[str(g)]}, lmms-eval {theirs}")
    assert not bad, "\n".join(bad[:10])
    assert theirs_prompts and set(theirs_prompts) <= set(ours_judge.prompts)   # same prompt text
    assert 0 < sum(units.values()) < len(units)


# --- MathVista: mathvista_process_results with its GPT extraction -------------------------------------

MV_RESPONSES = ["3", " 3 ", "3.0", "+3", "1_000", "three", "The answer is 3.", "x = 3", "(B)", "B", "b", "(b) 5 cm",
                "5 cm", "5cm", "It is 5 cm.", "", "1.5", "1.50", "1.456", "[1, 2]", "[1,2]", "1e3", "inf", "nan",
                "I cannot tell", "-2", "2,000", "0.5", ".5", "The value is about 12.34 m", "C. 7 cm", "7 cm."]
MV_REPLIES = ["3", "B", "(B) 5 cm", "", "5 cm", "1.5", "[1, 2]", "three", "C", "1.46", "12.3", "none", "(c)",
              "1,000", "2000", "7cm", "A"]


def mathvista_cases():
    choices = ["3 cm", "5 cm", "7 cm"]
    kinds = [("multi_choice", "text", None, choices, "5 cm"), ("multi_choice", "text", None, choices, "3 cm"),
             ("free_form", "integer", None, None, "3"), ("free_form", "integer", None, None, "1000"),
             ("free_form", "float", 1, None, "1.5"), ("free_form", "float", 2, None, "1.46"),
             ("free_form", "float", 2, None, "0.5"), ("free_form", "list", None, None, "[1, 2]")]
    cases = []
    for n, ((qtype, atype, precision, ch, gold), response) in enumerate(itertools.product(kinds, MV_RESPONSES)):
        query = f"Hint: answer it.\nQuestion: What is x? ({n})" + (
            "\nChoices:\n" + "\n".join(f"({chr(65 + i)}) {c}" for i, c in enumerate(ch)) if ch else "")
        item = BenchItem(benchmark="mathvista", index=str(n), question=f"What is x? ({n})", images=[], answer=gold,
                         meta={"question_type": qtype, "answer_type": atype, "precision": precision,
                               "choices": ch, "unit": "", "query": query})
        cases.append((item, response))
    return cases


def test_mathvista_judged_matches_mathvista_process_results(monkeypatch):
    from lmms_eval.tasks.mathvista import utils as mv_utils
    from lmms_eval.tasks.mathvista.mathvista_evals import MathVistaEvaluator

    judge = stand_in(MV_REPLIES)
    theirs_prompts: list[str] = []
    monkeypatch.setattr(MathVistaEvaluator, "get_chat_response",
                        lambda self, prompt, **kw: theirs_prompts.append(prompt) or judge(prompt).strip())
    cases = mathvista_cases()
    items = [it for it, _ in cases]
    ours_judge = Recorder(judge)
    ours = scorer_for("mathvista").score(items, [r for _, r in cases], ours_judge)
    bad = []
    for (item, response), s in zip(cases, ours):
        doc = {"pid": item.index, "query": item.meta["query"], "question_type": item.meta["question_type"],
               "answer_type": item.meta["answer_type"], "choices": item.meta["choices"], "answer": item.answer,
               "precision": item.meta["precision"], "metadata": {}}
        theirs = mv_utils.mathvista_process_results(doc, [response])["llm_as_judge_eval"]
        if float(theirs["true_false"]) != s.score or (theirs["prediction"] or "") != s.extracted:
            bad.append(f"{response!r} ({item.meta['answer_type']}, gold {item.answer!r}): ours {s.score} "
                       f"{s.extracted!r}, lmms-eval {theirs['true_false']} {theirs['prediction']!r}")
    assert not bad, "\n".join(bad[:20])
    assert set(theirs_prompts) == set(ours_judge.prompts)
    assert len(cases) >= 250 and 0 < sum(s.score for s in ours) < len(ours)


# --- MM-Vet / MM-Vet v2: mmvet_process_results with its GPT grader ------------------------------------

@pytest.mark.parametrize("benchmark, module", [("mmvet", "mmvet"), ("mmvet_v2", "mmvetv2")])
def test_mmvet_judged_matches_mmvet_process_results(monkeypatch, benchmark, module):
    import importlib

    utils = importlib.import_module(f"lmms_eval.tasks.{module}.utils")
    # never "1.5" or "nan": lmms-eval asks again forever for a number outside [0, 1] (documented)
    judge = stand_in(["0.5", "1.0", "0.0", "0.3 because", "0.7\nit is close", "", "high", "1e-1", "-0", "1",
                      " 0.9", "0.4.", "Correctness: 0.6"])
    theirs_prompts: list[str] = []
    monkeypatch.setattr(utils, "get_chat_response",
                        lambda prompt, **kw: (theirs_prompts.append(prompt) or judge(prompt).strip(), "stand-in"))
    monkeypatch.setattr(utils.time, "sleep", lambda s: None)
    golds = ["Paris<AND>Berlin", "3", "red<OR>crimson", "a cat on a mat", "2:30 <AND> 14:30"]
    preds = ["Paris", "Paris and Berlin", " 3 ", "three", "crimson red", "", "A cat.", "It is 2:30\n", "no idea",
             "Berlin | Paris", "**3**"]
    items, texts = [], []
    for n, (gold, pred) in enumerate(itertools.product(golds, preds)):
        items.append(BenchItem(benchmark=benchmark, index=f"v{n}", question=f"Question {n}? ", images=[],
                               answer=gold))
        texts.append(pred)
    ours_judge = Recorder(judge)
    ours = scorer_for(benchmark).score(items, texts, ours_judge)
    bad = []
    for item, pred, s in zip(items, texts, ours):
        doc = {"question_id": item.index, "id": item.index, "question": item.question, "answer": item.answer, "capability": "rec"}
        theirs = utils.mmvet_process_results(doc, [pred])["gpt_eval_score"]["score"]
        if theirs != s.score:
            bad.append(f"{pred!r} gold {item.answer!r}: ours {s.score}, lmms-eval {theirs}")
    assert not bad, "\n".join(bad[:20])
    assert set(theirs_prompts) == set(ours_judge.prompts)
    assert 0 < sum(s.score for s in ours) < len(ours)
