"""Where lmms-eval 0.7.3 asks GPT (MMBench matching, MathVista extraction, the MM-Vet grader): the same
deterministic stand-in judge answers both lmms-eval's own task (its API call patched; the responses go
through the harness's whole path, `harness.run_task`) and our `lmms-eval` protocol, which must send the
same prompt text and reach the same score on every item. Without a judge, lmms-eval's own path with its
API unreachable is the reference."""
from __future__ import annotations

import hashlib
import itertools
import random

import pytest

from protege.bench.items import BenchItem
from protege.eval.scorers import scorer_for

pytest.importorskip("lmms_eval.tasks._task_utils.mcq_extract", reason="lmms-eval 0.7.3 is installed by `make test`")
pytest.importorskip("Levenshtein", reason="lmms-eval's MathVista evaluator needs it; `make test` installs it")
from tests.differential.harness import benchmark_config, run_task  # noqa: E402
from tests.differential.test_lmms_eval_rules import (  # noqa: E402
    MMBENCH_EDGE,
    harness_mmbench_groups,
    mmbench_groups,
    wrapped,
)


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


# --- MMBench: eval_result("openai") with its GPT matcher ---------------------------------------------

MMBENCH_FREE = ["it is a fruit", "the yellow one", "I like apples", "a red fruit", "not sure", "cherry pie", "选香蕉",
                "Maybe the second", "B or C", "something round", "grapes are purple", "????", "答案是B", "**B**", "B。"]


@pytest.mark.parametrize("benchmark", ["mmbench", "mmbench_cn"])
def test_mmbench_judged_matches_eval_result(monkeypatch, benchmark):
    from lmms_eval.tasks.mmbench import mmbench_evals
    from lmms_eval.tasks.mmbench.mmbench_evals import MMBench_Evaluator

    judge = stand_in(["A", "B", "C", "D", "E", "The answer is B.", "nothing fits", "A and B", "(C)", "Option D",
                      "B.", " C "])
    theirs_prompts: list[str] = []
    monkeypatch.setattr(MMBench_Evaluator, "get_chat_response",
                        lambda self, prompt, **kw: theirs_prompts.append(prompt) or judge(prompt).strip())
    # the harness's random letter after three failed matches: "E", which is never the gold (we score 0)
    monkeypatch.setattr(mmbench_evals.rd, "randint", lambda lo, hi: hi)
    edge = wrapped(MMBENCH_FREE, 7) + MMBENCH_EDGE
    items, preds = mmbench_groups(benchmark, 120, 7, edge)
    rng = random.Random(7)  # past the edge groups, free answers the judge has to match
    preds = [p if int(it.group) < len(edge) else rng.choice([p, rng.choice(MMBENCH_FREE)])
             for it, p in zip(items, preds)]
    ours_judge = Recorder(judge)
    scorer = scorer_for(benchmark)
    units = {u.id: u.score for u in scorer.units(items, scorer.score(items, preds, ours_judge))}
    theirs = harness_mmbench_groups(benchmark, items, preds)
    bad = [f"group {g} {[(it.answer, p) for it, p in zip(items, preds) if it.group == g]}: ours {units[g]}, "
           f"lmms-eval {theirs[g]}" for g in units if units[g] != theirs[g]]
    assert not bad, "\n".join(bad[:10])
    assert theirs_prompts and set(theirs_prompts) <= set(ours_judge.prompts)   # same prompt text
    assert 0 < sum(units.values()) < len(units)


# --- MathVista: mathvista_process_results with and without its GPT extraction ------------------------

MV_RESPONSES = ["3", " 3 ", "3.0", "+3", "1_000", "three", "The answer is 3.", "x = 3", "(B)", "B", "b", "(b) 5 cm",
                "5 cm", "5cm", "It is 5 cm.", "", "1.5", "1.50", "1.456", "[1, 2]", "[1,2]", "1e3", "inf", "nan",
                "I cannot tell", "-2", "2,000", "0.5", ".5", "The value is about 12.34 m", "C. 7 cm", "7 cm.",
                "12%", "twelve", "C.", "c", "(d)", "D", "13", "13.0 ", "<think>B</think>D", "\n 9 cm\n", "None",
                "thirteen", "13 apples", "The answer is D", "[1, 2", "1/2"]
MV_REPLIES = ["3", "B", "(B) 5 cm", "", "5 cm", "1.5", "[1, 2]", "three", "C", "1.46", "12.3", "none", "(c)",
              "1,000", "2000", "7cm", "A", "D", "13", "(D) 9 cm", "13.0", "12.96", " D ", "d", "9 cm", "None"]


def mathvista_cases():
    three, four = ["3 cm", "5 cm", "7 cm"], ["3 cm", "5 cm", "7 cm", "9 cm"]
    kinds = [("multi_choice", "text", None, three, "5 cm"), ("multi_choice", "text", None, three, "3 cm"),
             ("multi_choice", "text", None, four, "9 cm"), ("multi_choice", "text", None, ["B", "A", "long"], "A"),
             ("free_form", "integer", None, None, "3"), ("free_form", "integer", None, None, "1000"),
             ("free_form", "integer", None, None, "13"), ("free_form", "float", 1, None, "13.0"),
             ("free_form", "float", 1, None, "1.5"), ("free_form", "float", 2, None, "1.46"),
             ("free_form", "float", 2, None, "0.5"), ("free_form", "list", None, None, "[1, 2]"),
             ("free_form", "text", None, None, "None")]
    cases = []
    for n, ((qtype, atype, precision, ch, gold), response) in enumerate(itertools.product(kinds, MV_RESPONSES)):
        query = f"Hint: answer it.\nQuestion: What is x? ({n})" + (
            "\nChoices:\n" + "\n".join(f"({chr(65 + i)}) {c}" for i, c in enumerate(ch)) if ch else "")
        item = BenchItem(benchmark="mathvista", index=str(n), question=f"What is x? ({n})", images=[], answer=gold,
                         meta={"question_type": qtype, "answer_type": atype, "precision": precision,
                               "choices": ch, "unit": "", "query": query})
        cases.append((item, response))
    return cases


def _compare_mathvista(cases, complete):
    items, responses = [it for it, _ in cases], [r for _, r in cases]
    ours = scorer_for("mathvista").score(items, responses, complete)
    theirs = [r["llm_as_judge_eval"] for r in run_task("mathvista", items, responses)]
    bad = [f"{response!r} ({item.meta['answer_type']}, gold {item.answer!r}): ours {s.score} {s.extracted!r}, "
           f"lmms-eval {t['true_false']} {t['prediction']!r}"
           for (item, response), s, t in zip(cases, ours, theirs)
           if float(t["true_false"]) != s.score or (t["prediction"] or "") != s.extracted]
    assert not bad, "\n".join(bad[:20])
    return ours


def test_mathvista_judged_matches_the_mathvista_task(monkeypatch):
    from lmms_eval.tasks.mathvista.mathvista_evals import MathVistaEvaluator

    judge = stand_in(MV_REPLIES)
    theirs_prompts: list[str] = []
    monkeypatch.setattr(MathVistaEvaluator, "get_chat_response",
                        lambda self, prompt, **kw: theirs_prompts.append(prompt) or judge(prompt).strip())
    cases = mathvista_cases()
    ours_judge = Recorder(judge)
    ours = _compare_mathvista(cases, ours_judge)
    assert set(theirs_prompts) == set(ours_judge.prompts)
    assert len(cases) >= 500 and 0 < sum(s.score for s in ours) < len(ours)


def test_mathvista_judge_replies_are_used():
    """The issue's cases: the judge's "D" is the 4th choice, its "13" at precision 1 is 13.0."""
    by_kind = {(it.meta["answer_type"], it.answer): it for it, _ in mathvista_cases()}
    items = [by_kind[("text", "9 cm")], by_kind[("float", "13.0")]]
    out = scorer_for("mathvista").score(items, ["The last one.", "About thirteen."], lambda ps: ["D", "13"][:len(ps)])
    assert [(s.score, s.extracted, s.note) for s in out] == [(1.0, "9 cm", "llm extraction"),
                                                              (1.0, "13.0", "llm extraction")]


def test_mathvista_without_a_judge_matches_the_mathvista_task(monkeypatch):
    """lmms-eval with its API unreachable: get_chat_response gives up with '' (its own loop runs)."""
    from lmms_eval.llm_judge.protocol import Response
    from lmms_eval.tasks.mathvista.mathvista_evals import MathVistaEvaluator

    class Unreachable:
        calls = 0

        def evaluate(self, request):
            Unreachable.calls += 1
            return Response(content="", model_used="", success=False, error_message="no judge configured")

    monkeypatch.setattr(MathVistaEvaluator, "server", Unreachable())
    cases = mathvista_cases()
    ours = _compare_mathvista(cases, None)
    assert Unreachable.calls > 0 and 0 < sum(s.score for s in ours) < len(ours)
    read = {(it.meta["answer_type"], it.answer, r): s for (it, r), s in zip(cases, ours)}
    # the generous readings stay with protocol lenient
    assert read[("integer", "13", "thirteen")].score == read[("integer", "13", "12%")].score == 0.0
    assert read[("text", "9 cm", "(d)")].extracted == "3 cm"   # nearest to '' is the first shortest choice


# --- MM-Vet / MM-Vet v2: mmvet_process_results with its GPT grader ------------------------------------

@pytest.mark.parametrize("benchmark", ["mmvet", "mmvet_v2"])
def test_mmvet_judged_matches_the_mmvet_task(monkeypatch, benchmark):
    config = benchmark_config(benchmark)
    task_globals = config["process_results"].__globals__
    # never "1.5" or "nan": lmms-eval asks again forever for a number outside [0, 1] (documented)
    judge = stand_in(["0.5", "1.0", "0.0", "0.3 because", "0.7\nit is close", "", "high", "1e-1", "-0", "1",
                      " 0.9", "0.4.", "Correctness: 0.6"])
    theirs_prompts: list[str] = []
    monkeypatch.setitem(task_globals, "get_chat_response",
                        lambda prompt, **kw: (theirs_prompts.append(prompt) or judge(prompt).strip(), "stand-in"))
    monkeypatch.setattr(task_globals["time"], "sleep", lambda s: None)
    golds = ["Paris<AND>Berlin", "3", "red<OR>crimson", "a cat on a mat", "2:30 <AND> 14:30"]
    preds = ["Paris", "Paris and Berlin", " 3 ", "three", "crimson red", "", "A cat.", "It is 2:30\n", "no idea",
             "Berlin | Paris", "**3**", "<think>Rome?</think>Paris", "\n\tParis  "]
    items, texts = [], []
    for n, (gold, pred) in enumerate(itertools.product(golds, preds)):
        items.append(BenchItem(benchmark=benchmark, index=f"v{n}", question=f"Question {n}? ", images=[],
                               answer=gold))
        texts.append(pred)
    ours_judge = Recorder(judge)
    ours = scorer_for(benchmark).score(items, texts, ours_judge)
    theirs = [r["gpt_eval_score"]["score"] for r in run_task(benchmark, items, texts, config)]
    bad = [f"{pred!r} gold {item.answer!r}: ours {s.score}, lmms-eval {t}"
           for item, pred, s, t in zip(items, texts, ours, theirs) if t != s.score]
    assert not bad, "\n".join(bad[:20])
    assert set(theirs_prompts) == set(ours_judge.prompts)
    assert 0 < sum(s.score for s in ours) < len(ours)


# --- MM-Vet's retries: a judge whose reply changes from one ask to the next ---------------------------

# per prompt, the replies of its successive asks (the last one repeats): a grade after an unreadable one is
# asked twice, the first reply dropped; blank replies are asked again inside get_chat_response (3 asks)
MMVET_SCRIPTS = [["0.5"], ["high", "0.9", "0.3"], ["", "0.4"], ["", "", "", "0.8"], ["no", "0.1", "0.2", "0.6"],
                 ["x"], ["", "", "bad", "0.7", "", "", "", "1.0"], ["Correctness: 0.6", "0.6 ok", "0.2"],
                 ["bad", "", "", "", "0.3"]]


class Scripted:
    """A judge whose n-th reply to a prompt is its script's n-th entry; the script is picked by the prompt."""

    def __init__(self):
        self.asked: dict[str, int] = {}

    def __call__(self, prompt: str) -> str:
        script = MMVET_SCRIPTS[int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % len(MMVET_SCRIPTS)]
        n = self.asked[prompt] = self.asked.get(prompt, 0) + 1
        return script[min(n, len(script)) - 1]


def test_mmvet_retries_use_the_reply_lmms_eval_uses(monkeypatch):
    """lmms-eval's own get_chat_response runs (its judge server patched), so its patience on blank replies and
    the reply it drops after an unreadable grade are the harness's."""
    from lmms_eval.llm_judge.protocol import Response

    config = benchmark_config("mmvet")
    task_globals = config["process_results"].__globals__
    theirs_judge = Scripted()

    class Server:
        def evaluate(self, request):
            return Response(content=theirs_judge(request.messages[0]["content"]), model_used="scripted")

    monkeypatch.setitem(task_globals, "server", Server())
    monkeypatch.setattr(task_globals["time"], "sleep", lambda s: None)
    items = [BenchItem(benchmark="mmvet", index=f"v{n}", question=f"Question {n}?", images=[], answer="3")
             for n in range(90)]
    texts = [f"There are {n % 5} of them." for n in range(90)]
    ours_judge = Scripted()
    ours = scorer_for("mmvet").score(items, texts, lambda prompts: [ours_judge(p) for p in prompts])
    theirs = [r["gpt_eval_score"]["score"] for r in run_task("mmvet", items, texts, config)]
    bad = [f"{it.index}: ours {s.score} ({s.note}), lmms-eval {t}" for it, s, t in zip(items, ours, theirs)
           if s.score != t]
    assert not bad, "\n".join(bad[:20])
    assert ours_judge.asked == theirs_judge.asked                    # the same asks of every prompt
    # 0.9 and 0.1 are only ever the dropped replies; 0.8 comes after three blanks, which already scored 0
    assert {s.score for s in ours} == {0.0, 0.2, 0.3, 0.4, 0.5}
