"""Our `lmms-eval` protocol against lmms-eval 0.7.3's own scoring functions, item by item.

lmms-eval is installed by `make test` (pinned, without its model extras). The answers are generated
from templates: letters in every position and case, bold, brackets, Chinese phrasing, several letters,
option texts, numbers, refusals. A failing case prints the input and both outcomes.
"""
from __future__ import annotations

import itertools
import random

import pytest

from protege.eval.items import BenchItem
from protege.eval.scorers import scorer_for
from protege.eval.scorers.lmms_mcq import lmms_mcq_letter

lmms_mcq = pytest.importorskip("lmms_eval.tasks._task_utils.mcq_extract",
                               reason="lmms-eval 0.7.3 is installed by `make test`")
from lmms_eval.tasks.mmstar.utils import mmstar_process_results  # noqa: E402
from lmms_eval.tasks.realworldqa.utils import realworldqa_process_results  # noqa: E402

LETTER_TEMPLATES = [
    "{L}", "{l}", "({L})", "({l})", "{L}.", "{L})", "{L}:", "[{L}]", "**{L}**", "**({L})**", "{L}. {T}",
    "({L}) {T}", "Answer: {L}", "answer: {l}", "The answer is {L}.", "the answer is ({l})", "The correct answer is {L}",
    "I choose {L}", "My answer is option {L}.", "答案是{L}", "答案为（{L}）", "选{L}", "我选{L}。", "正确答案：{L}",
    "{T}", "It is {T}.", "I think {L} and {M}", "{L} or {M}", "Not {M}, {L}.", "{M} is wrong; {L} is right",
    "Between {L} and {M}, the answer is {M}", "{L}{M}", "Option {L}", "option {l} is correct", "{L} -- {T}",
    "I cannot tell.", "None of the above.", "A {T} is shown, so {L}", "Apple", "Dog", "THE ANSWER IS {L}",
    "{L}\n", "\n{L}.\n", " {L} ", "'{L}'", '"{L}."', "{L}!", "{L}?", "Is it {L}?", "{L}; {M}", "E", "(E)",
    "The image shows {T}. Answer: {L}", "{L}.{M}.", "A: {T}", "1. {L}", "{L}2", "Choice {L}", "{L}、{T}",
]
TEXTS = ["apple", "a red apple", "Banana", "the cat", "3", "Cherry pie"]


def awkward_answers(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for template, L, M in itertools.product(LETTER_TEMPLATES, "ABCD", "ABCD"):
        if L == M and "{M}" in template:
            continue
        out.append(template.format(L=L, l=L.lower(), M=M, T=rng.choice(TEXTS)))
    rng.shuffle(out)
    return out[:n]


def test_letter_reading_matches_extract_mcq_answer():
    answers = awkward_answers(800, 0)
    diffs = [(a, lmms_mcq_letter(a, ("A", "B", "C", "D")), lmms_mcq.extract_mcq_answer(a, choices=["A", "B", "C", "D"]))
             for a in answers]
    bad = [d for d in diffs if d[1] != d[2]]
    assert not bad, "\n".join(f"{a!r}: ours {o!r}, lmms-eval {t!r} (extract_mcq_answer)" for a, o, t in bad[:20])
    assert len(answers) >= 300


def test_mmstar_matches_mmstar_process_results():
    answers = awkward_answers(400, 1)
    golds = [random.Random(i).choice("ABCD") + random.Random(i).choice(["", " ", "\n"]) for i in range(len(answers))]
    items = [BenchItem(benchmark="mmstar", index=str(i), question="Q?", images=[], answer=g,
                       options={k: t for k, t in zip("ABCD", TEXTS)}, category="c", l2_category="l2")
             for i, g in enumerate(golds)]
    ours = scorer_for("mmstar").score(items, answers)
    bad = []
    for item, a, s in zip(items, answers, ours):
        theirs = mmstar_process_results({"answer": item.answer, "category": "c", "l2_category": "l2",
                                         "index": item.index}, [a])["average"]["score"]
        if s.score != theirs:
            bad.append(f"{a!r} gold {item.answer!r}: ours {s.score}, lmms-eval {theirs} (mmstar exact_match)")
    assert not bad, "\n".join(bad[:20])


def test_realworldqa_matches_realworldqa_process_results():
    answers = awkward_answers(300, 2) + ["2", "two", "Two.", "2 cars", "yes", "Yes.", "YES", "no", "Downhill",
                                         "downhill.", " Downhill ", "3.", "3..", "left", "Left side"]
    open_golds = ["2", "Yes", "No", "Downhill", "3", "left"]
    rng = random.Random(3)
    golds = [rng.choice(["A", "B", "c", " D "] + open_golds) for _ in answers]
    items = [BenchItem(benchmark="realworldqa", index=str(i), question="Q?\nA. left\nB. right\nC. up\nD. down",
                       images=[], answer=g) for i, g in enumerate(golds)]
    ours = scorer_for("realworldqa").score(items, answers)
    bad = []
    for item, a, s in zip(items, answers, ours):
        theirs = realworldqa_process_results({"answer": item.answer}, [a])["exact_match"]
        if s.score != theirs:
            bad.append(f"{a!r} gold {item.answer!r}: ours {s.score}, lmms-eval {theirs} (realworldqa_process_results)")
    assert not bad, "\n".join(bad[:20])


def test_mmbench_rules_only_matches_eval_sub_data():
    """Circular groups (four rotated copies) scored by lmms-eval's rules-only MMBench evaluation."""
    import pandas as pd
    from lmms_eval.tasks.mmbench.mmbench_evals import MMBench_Evaluator

    harness = MMBench_Evaluator()
    texts = ["apple", "banana", "cherry", "grape"]
    rng = random.Random(4)
    answers = awkward_answers(2000, 5)
    edge = ["I see A small cat", "a banana", "The fruit is Banana.", "E", "A B", "Failed to obtain answer via API",
            "apple or banana", "选项B", "(E)", "E B.", "E (A)", "E :C", "Option E, not (B)", "B E", "答案是（B）"]
    items, preds, groups = [], [], 0
    for g in range(150):
        gold_text = rng.choice(texts)
        for k in range(4):
            opts = {letter: texts[(i + k) % 4] for i, letter in enumerate("ABCD")}
            gold = next(letter for letter, t in opts.items() if t == gold_text)
            items.append(BenchItem(benchmark="mmbench", index=str(g + k * 1_000_000), question="Which fruit?",
                                   images=[], answer=gold, options=opts, group=str(g)))
            if g < len(edge):  # the group's outcome hangs on this one answer
                preds.append(edge[g] if k == 0 else gold)
            else:
                preds.append(rng.choice([gold, gold_text, rng.choice(answers), rng.choice(answers)]))
        groups += 1
    scorer = scorer_for("mmbench")
    units = {u.id: u.score for u in scorer.units(items, scorer.score(items, preds))}
    bad = []
    for g in range(groups):
        copies = [(it, p) for it, p in zip(items, preds) if it.group == str(g)]
        frame = pd.DataFrame([{"index": int(it.index), "prediction": p, "answer": it.answer, **it.options}
                              for it, p in copies])
        theirs = harness.eval_sub_data(frame, {int(it.index): it.answer for it, _ in copies}, static_only=True)
        if units[str(g)] != theirs:
            bad.append(f"group {g} {[(it.answer, p) for it, p in copies]}: ours {units[str(g)]}, lmms-eval {theirs} "
                       "(MMBench_Evaluator.eval_sub_data, static)")
    assert not bad, "\n".join(bad[:10])


def _compare(benchmark, items, answers, theirs_fn, rule):
    ours = scorer_for(benchmark).score(items, answers)
    bad = [f"{a!r} gold {it.answer!r}: ours {s.score}, lmms-eval {t} ({rule})"
           for it, a, s in zip(items, answers, ours) if s.score != (t := theirs_fn(it, a))]
    assert not bad, "\n".join(bad[:20])


def _mc_items(benchmark, golds, n_options=4):
    return [BenchItem(benchmark=benchmark, index=str(i), question="Q?", images=[], answer=g,
                      options={k: t for k, t in zip("ABCDEF"[:n_options], TEXTS)}) for i, g in enumerate(golds)]


EXTRA = ["", " ", "B\n", " B", "b", "b.", "B.", "B. apple", "(B)", "B)", "Banana", "The answer is B", "\nB"]


def test_ai2d_matches_filter_and_exact_match():
    from lmms_eval.api.metrics import exact_match_hf_evaluate
    from lmms_eval.tasks.ai2d.utils import MultiChoiceRegexFilter

    answers = awkward_answers(400, 6) + EXTRA
    rng = random.Random(6)
    items = _mc_items("ai2d", [rng.choice("ABCD") for _ in answers])
    flt = MultiChoiceRegexFilter(regex_pattern=r"([A-Z])\.", group_select=0, ignore_case=True, ignore_punctuation=True)

    def theirs(item, answer):
        filtered = flt.apply([[answer]], [{"question": item.question}])[0]
        return float(exact_match_hf_evaluate([filtered], [item.answer], ignore_case=True,
                                             ignore_punctuation=True)["exact_match"])

    _compare("ai2d", items, answers, theirs, "MultiChoiceRegexFilter + exact_match")


@pytest.mark.parametrize("benchmark", ["seedbench", "seedbench2_plus"])
def test_seedbench_matches_process_and_aggregate(benchmark):
    import lmms_eval.tasks.seedbench.utils as seed1
    import lmms_eval.tasks.seedbench_2_plus.utils as seed2

    answers = awkward_answers(300, 7) + EXTRA
    rng = random.Random(7)
    items = _mc_items(benchmark, [rng.choice(["A", "B", "c", " D"]) for _ in answers])

    def theirs(item, answer):
        doc = {"answer": item.answer, "question_id": item.index, "data_type": "image", "question_image_type": "chart"}
        if benchmark == "seedbench":
            result = seed1.seed_process_result(doc, [answer])["seed_all"]
            return float(seed1.seed_aggregation_result([result]))
        result = seed2.seed_process_result(doc, [answer])["seedbench_2_plus_all"]
        return float(seed2.seed_aggregation_result([result]))

    _compare(benchmark, items, answers, theirs, "seed_process_result + seed_aggregation_result")


def test_blink_matches_blink_process_results():
    from lmms_eval.tasks.blink.utils import blink_process_results

    answers = awkward_answers(400, 8) + EXTRA + ["E", "(E)", "The answers are (A) and (B)", "answer: c", "A or B",
                                                 "Answer is (D)\nmore", "(A) and (B)", "c)", "Answers: B"]
    rng = random.Random(8)
    n_options = [rng.choice([2, 3, 4]) for _ in answers]
    items = [BenchItem(benchmark="blink", index=str(i), question="Q?", images=[],
                       answer=f"({'ABCD'[rng.randrange(n)]})", options={k: t for k, t in zip("ABCD"[:n], TEXTS)})
             for i, n in enumerate(n_options)]

    def theirs(item, answer):
        doc = {"answer": item.answer, "choices": list(item.options.values()), "idx": item.index, "sub_task": "s"}
        return float(blink_process_results(doc, [answer])["blink_acc"]["is_correct"])

    _compare("blink", items, answers, theirs, "blink_process_results")


@pytest.mark.parametrize("n_options", [4, 10])
def test_mmmu_multiple_choice_matches_parse_mmmu_multi_choice_response(n_options, monkeypatch):
    import lmms_eval.tasks._task_utils.mmmu_mcq_utils as mmmu

    monkeypatch.setattr(mmmu.random, "choice", lambda seq: "<random>")  # where the harness guesses
    texts = ["apple", "a red apple", "banana", "the cat", "3", "cherry pie", "dog", "grape", "10", "kiwi"]
    options = dict(zip("ABCDEFGHIJ"[:n_options], texts[:n_options]))
    answers = awkward_answers(500, 9) + EXTRA + [
        "I think the answer is a red apple, not banana", "It looks like a banana to me here", "(A) or (B)",
        "A. apple B. banana", "Option C is the cat, so C", "The image shows the cat and a dog clearly", "J"]
    rng = random.Random(9)
    items = [BenchItem(benchmark="mmmu", index=str(i), question="Q?", images=[], answer=rng.choice(list(options)),
                       options=options) for i in range(len(answers))]
    ours = scorer_for("mmmu").score(items, answers)
    bad = []
    for item, a, s in zip(items, answers, ours):
        parsed = mmmu.parse_mmmu_multi_choice_response(a, list(options), dict(options))
        if (parsed == "<random>") != (s.note.startswith("no option found")) or \
                (parsed != "<random>" and float(parsed == item.answer) != s.score):
            bad.append(f"{a!r} gold {item.answer!r}: ours {s.extracted!r} {s.score}, lmms-eval {parsed!r}")
    assert not bad, "\n".join(bad[:20])


def test_chartqa_matches_chartqa_process_results():
    from lmms_eval.tasks.chartqa.utils import chartqa_process_results

    rng = random.Random(10)
    golds = ["12", "0", "0.45", "45%", "1,234", "Yes", "blue", "3.5", "-2", "100", "nan", "1e3"]
    preds = ["12", "12.5", "12.7", " 12", "12\n", "12.", "0", "0.0", "zero", "45", "0.45", "45%", "45%%", "1234",
             "1,234", "1234.0", "yes", "Yes.", "YES", "Blue", "blue ", "3.6", "3.68", "-2.05", "2", "105", "95",
             "nan", "inf", "1000", "1e3", "", "12 apples", "The answer is 12"]
    items, answers = [], []
    for i in range(600):
        items.append(BenchItem(benchmark="chartqa", index=str(i), question="Q?", images=[], answer=rng.choice(golds)))
        answers.append(rng.choice(preds))
    _compare("chartqa", items, answers,
             lambda it, a: chartqa_process_results({"type": "human_test", "answer": it.answer}, [a])["relaxed_overall"],
             "chartqa_process_results")


def test_mmmu_open_matches_parse_open_response_and_eval_open():
    from lmms_eval.tasks.mmmu.utils import eval_open, parse_open_response

    rng = random.Random(12)
    golds = ["3", "3.14", "1,000", "-2", "0.5", "x", "red", "Paris", "24/7", "['1', '2']", "1e3", "12 kg", "a"]
    stems = ["{g}", "The answer is {g}.", "so the result is {g}", "x = {g}", "I think it could be {g}, not 4",
             "Answer: {g}\nbecause", "{g} kg", "It is {w}.", "The value is about {g}0", "Therefore, {g}.",
             "Final answer {g}", "three", "The answer is: ", "is so {g}", "{g}%", "approximately {g}.0"]
    items, answers = [], []
    for i in range(600):
        gold, other = rng.choice(golds), rng.choice(golds)
        items.append(BenchItem(benchmark="mmmu", index=str(i), question="Q?", images=[], answer=gold))
        answers.append(rng.choice(stems).format(g=rng.choice([gold, other]), w=other.upper()))
    # each decided by one quirk: a trivial tail is dropped, an empty tail gives way to the next key phrase
    for answer, gold in [("The answer is : ", "a"), ("answer is \n7", "is"), ("it is so \nthus 5", "so"),
                         ("x = 2\ny = 3", "2"), ("Result: 1,234.5 units", "1234.5")]:
        items.append(BenchItem(benchmark="mmmu", index=str(len(items)), question="Q?", images=[], answer=gold))
        answers.append(answer)
    _compare("mmmu", items, answers, lambda it, a: float(eval_open(it.answer, parse_open_response(a))),
             "parse_open_response + eval_open")
