"""Our `lmms-eval` protocol against lmms-eval 0.7.3's own scoring, item by item.

lmms-eval is installed by `make test` (pinned, without its model extras). Each benchmark's answers go
through the harness's whole path (`harness.run_task`: the task built from its yaml, its filters, the
default reasoning-tag removal, `Task.process_results` with its strip, the task's rule), then through our
scorer. The answers are generated from templates: letters in every position and case, bold, brackets,
Chinese phrasing, several letters, option texts, numbers, refusals, each also wrapped in whitespace and
<think> / <analysis> blocks. A failing case prints the input and both outcomes.
"""
from __future__ import annotations

import itertools
import random

import pytest

from protege.bench.items import BenchItem
from protege.eval.scorers import scorer_for
from protege.eval.scorers.lmms_mcq import lmms_mcq_letter
from protege.eval.scorers.lmms_pipeline import drop_reasoning

lmms_mcq = pytest.importorskip("lmms_eval.tasks._task_utils.mcq_extract",
                               reason="lmms-eval 0.7.3 is installed by `make test`")
from tests.differential.harness import run_task  # noqa: E402

LETTER_TEMPLATES = [
    "{L}", "{l}", "({L})", "({l})", "{L}.", "{L})", "{L}:", "[{L}]", "**{L}**", "**({L})**", "{L}. {T}",
    "({L}) {T}", "Answer: {L}", "answer: {l}", "The answer is {L}.", "the answer is ({l})", "The correct answer is {L}",
    "I choose {L}", "My answer is option {L}.", "答案是{L}", "答案为（{L}）", "选{L}", "我选{L}。", "正确答案：{L}",
    "{T}", "It is {T}.", "I think {L} and {M}", "{L} or {M}", "Not {M}, {L}.", "{M} is wrong; {L} is right",
    "Between {L} and {M}, the answer is {M}", "{L}{M}", "Option {L}", "option {l} is correct", "{L} -- {T}",
    "I cannot tell.", "None of the above.", "A {T} is shown, so {L}", "Apple", "Dog", "THE ANSWER IS {L}",
    "{L}\n", "\n{L}.\n", " {L} ", "'{L}'", '"{L}."', "{L}!", "{L}?", "Is it {L}?", "{L}; {M}", "E", "(E)",
    "The image shows {T}. Answer: {L}", "{L}.{M}.", "A: {T}", "1. {L}", "{L}2", "Choice {L}", "{L}、{T}",
    "{L}。", "It is {L} and it is", "{L} )", "\t{L}\t", "{L}\x00",
]
TEXTS = ["apple", "a red apple", "Banana", "the cat", "3", "Cherry pie"]
# what a response may carry around its answer; lmms-eval's pipeline removes some of it
WRAPPERS = ["{a}", "{a}", "{a}", " {a}", "{a} ", "{a}\n", "\n\n{a}\n", "<think>Maybe {b}.</think>{a}",
            "<think>\n{b} or not\n</think>\n\n{a}", "</think>{a}", "{b} reasons</think> {a}",
            "<analysis>{b}</analysis>{a}", "<think>{a}", "<THINK>{b}</THINK>{a}", "{a}<think>{b}</think>", "<think>x</think><think>{b}</think>{a}"]


def wrapped(answers: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(WRAPPERS).format(a=a, b=rng.choice("ABCD")) for a in answers]


def awkward_answers(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for template, L, M in itertools.product(LETTER_TEMPLATES, "ABCD", "ABCD"):
        if L == M and "{M}" in template:
            continue
        out.append(template.format(L=L, l=L.lower(), M=M, T=rng.choice(TEXTS)))
    rng.shuffle(out)
    return wrapped(out[:n], seed)


def _compare(benchmark, items, answers, harness_score, rule):
    """Our scorer and lmms-eval's task on the same raw answers: equal scores on every item."""
    ours = scorer_for(benchmark).score(items, answers)
    theirs = [harness_score(r) for r in run_task(benchmark, items, answers)]
    bad = [f"{a!r} gold {it.answer!r}: ours {s.score} ({s.extracted!r}), lmms-eval {t} ({rule})"
           for it, a, s, t in zip(items, answers, ours, theirs) if s.score != float(t)]
    assert not bad, "\n".join(bad[:20])
    return ours


def _mc_items(benchmark, golds, n_options=4):
    return [BenchItem(benchmark=benchmark, index=str(i), question="Q?", images=[], answer=g,
                      options={k: t for k, t in zip("ABCDEF"[:n_options], TEXTS)}) for i, g in enumerate(golds)]


EXTRA = ["", " ", "B\n", " B", "b", "b.", "B.", "B. apple", "(B)", "B)", "Banana", "The answer is B", "\nB",
         "B\n\n", "\tB", "B \n", "<think>A</think>B", "<think>A</think>\nB.", "B</think>", "A. <think>x</think>"]


def test_drop_reasoning_matches_strip_reasoning_tags():
    from lmms_eval.api.reasoning import strip_reasoning_tags

    from tests.differential.harness import cli_reasoning_tags

    pieces = ["<think>", "</think>", "<analysis>", "</analysis>", "A", " B ", "\n", "<THINK>", "x"]
    rng = random.Random(20)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(8))) for _ in range(3000)]
    bad = [t for t in texts if drop_reasoning(t) != strip_reasoning_tags(t, cli_reasoning_tags())]
    assert not bad, "\n".join(f"{t!r}: ours {drop_reasoning(t)!r}" for t in bad[:20])


def test_letter_reading_matches_extract_mcq_answer():
    answers = awkward_answers(800, 0)
    diffs = [(a, lmms_mcq_letter(a, ("A", "B", "C", "D")), lmms_mcq.extract_mcq_answer(a, choices=["A", "B", "C", "D"]))
             for a in answers]
    bad = [d for d in diffs if d[1] != d[2]]
    assert not bad, "\n".join(f"{a!r}: ours {o!r}, lmms-eval {t!r} (extract_mcq_answer)" for a, o, t in bad[:20])
    assert len(answers) >= 300


def test_mmstar_matches_the_mmstar_task():
    answers = awkward_answers(500, 1) + EXTRA
    rng = random.Random(1)
    golds = [rng.choice("ABCD") + rng.choice(["", " ", "\n"]) for _ in answers]
    items = [BenchItem(benchmark="mmstar", index=str(i), question="Q?", images=[], answer=g,
                       options={k: t for k, t in zip("ABCD", TEXTS)}, category="c", l2_category="l2")
             for i, g in enumerate(golds)]
    _compare("mmstar", items, answers, lambda r: r["average"]["score"], "mmstar_process_results")


def test_realworldqa_matches_the_realworldqa_task():
    answers = awkward_answers(300, 2) + wrapped(["2", "two", "Two.", "2 cars", "yes", "Yes.", "YES", "no", "Downhill",
                                                 "downhill.", " Downhill ", "3.", "3..", "left", "Left side"] * 3, 2)
    open_golds = ["2", "Yes", "No", "Downhill", "3", "left"]
    rng = random.Random(3)
    golds = [rng.choice(["A", "B", "c", " D "] + open_golds) for _ in answers]
    items = [BenchItem(benchmark="realworldqa", index=str(i), question="Q?\nA. left\nB. right\nC. up\nD. down",
                       images=[], answer=g) for i, g in enumerate(golds)]
    _compare("realworldqa", items, answers, lambda r: r["exact_match"], "realworldqa_process_results")


def test_ai2d_matches_the_ai2d_task_and_its_filter_chain():
    """ai2d.yaml's flexible-extract chain (MultiChoiceRegexFilter), then the strip, then exact_match."""
    answers = awkward_answers(500, 6) + EXTRA + wrapped(EXTRA * 4, 6) + [
        "B.\n", " C. cat", "B \t", "b\n", "(b)\n", "B\n\nbecause", "B\x00", "\x00B", "B )", "c.", "  D.  "]
    rng = random.Random(6)
    items = _mc_items("ai2d", [rng.choice("ABCD") for _ in answers])
    ours = _compare("ai2d", items, answers, lambda r: r["exact_match"], "MultiChoiceRegexFilter + exact_match")
    assert ours[answers.index("B\n")].score == float(items[answers.index("B\n")].answer == "B")


@pytest.mark.parametrize("benchmark", ["seedbench", "seedbench2_plus"])
def test_seedbench_matches_the_seed_tasks(benchmark):
    import lmms_eval.tasks.seedbench.utils as seed1
    import lmms_eval.tasks.seedbench_2_plus.utils as seed2

    answers = awkward_answers(300, 7) + EXTRA
    rng = random.Random(7)
    items = _mc_items(benchmark, [rng.choice(["A", "B", "c", " D"]) for _ in answers])
    if benchmark == "seedbench":
        score = lambda r: seed1.seed_aggregation_result([r["seed_all"]])  # noqa: E731
    else:
        score = lambda r: seed2.seed_aggregation_result([r["seedbench_2_plus_all"]])  # noqa: E731
    _compare(benchmark, items, answers, score, "seed_process_result + seed_aggregation_result")


def test_blink_matches_the_blink_task():
    answers = awkward_answers(400, 8) + EXTRA + ["E", "(E)", "The answers are (A) and (B)", "answer: c", "A or B",
                                                 "Answer is (D)\nmore", "(A) and (B)", "c)", "Answers: B", " (B) \n"]
    rng = random.Random(8)
    n_options = [rng.choice([2, 3, 4]) for _ in answers]
    items = [BenchItem(benchmark="blink", index=str(i), question="Q?", images=[],
                       answer=f"({'ABCD'[rng.randrange(n)]})", options={k: t for k, t in zip("ABCD"[:n], TEXTS)})
             for i, n in enumerate(n_options)]
    _compare("blink", items, answers, lambda r: float(r["blink_acc"]["is_correct"]), "blink_process_results")


@pytest.mark.parametrize("benchmark, n_options", [("mmmu", 4), ("mmmu", 10), ("mmmu_pro", 10)])
def test_mmmu_multiple_choice_matches_the_mmmu_tasks(benchmark, n_options, monkeypatch):
    import lmms_eval.tasks._task_utils.mmmu_mcq_utils as mmmu

    monkeypatch.setattr(mmmu.random, "choice", lambda seq: "<random>")  # where the harness guesses
    texts = ["apple", "a red apple", "banana", "the cat", "3", "cherry pie", "dog", "grape", "10", "kiwi"]
    options = dict(zip("ABCDEFGHIJ"[:n_options], texts[:n_options]))
    answers = awkward_answers(500, 9) + EXTRA + wrapped([
        "I think the answer is a red apple, not banana", "It looks like a banana to me here", "(A) or (B)",
        "A. apple B. banana", "Option C is the cat, so C", "The image shows the cat and a dog clearly", "J"] * 3, 9)
    rng = random.Random(9)
    items = [BenchItem(benchmark=benchmark, index=str(i), question="Q?", images=[], answer=rng.choice(list(options)),
                       options=options) for i in range(len(answers))]
    ours = scorer_for(benchmark).score(items, answers)
    bad = []
    for item, a, s, r in zip(items, answers, ours, run_task(benchmark, items, answers)):
        parsed = r["mmmu_acc"]["parsed_pred"]
        parsed = parsed[0] if isinstance(parsed, list) else parsed
        if (parsed == "<random>") != (s.note.startswith("no option found")) or \
                (parsed != "<random>" and float(parsed == item.answer) != s.score):
            bad.append(f"{a!r} gold {item.answer!r}: ours {s.extracted!r} {s.score}, lmms-eval {parsed!r}")
    assert not bad, "\n".join(bad[:20])


def test_chartqa_matches_the_chartqa_task():
    rng = random.Random(10)
    golds = ["12", "0", "0.45", "45%", "1,234", "Yes", "blue", "3.5", "-2", "100", "nan", "1e3"]
    preds = ["12", "12.5", "12.7", " 12", "12\n", "12.", "0", "0.0", "zero", "45", "0.45", "45%", "45%%", "1234",
             "1,234", "1234.0", "yes", "Yes.", "YES", "Blue", "blue ", "3.6", "3.68", "-2.05", "2", "105", "95",
             "nan", "inf", "1000", "1e3", "", "12 apples", "The answer is 12", "45% ", " 0.45\n", "\t-2 ",
             "<think>maybe 13</think>12", "12</think>", "<think>12"]
    items, answers = [], []
    for i in range(800):
        items.append(BenchItem(benchmark="chartqa", index=str(i), question="Q?", images=[], answer=rng.choice(golds)))
        answers.append(rng.choice([rng.choice(preds), rng.choice(wrapped(preds, i))]))
    ours = _compare("chartqa", items, answers, lambda r: r["relaxed_overall"], "chartqa_process_results")
    issue = scorer_for("chartqa").score([BenchItem("chartqa", "x", "Q?", [], "0.45")], ["45% "])
    assert issue[0].score == 1.0 and len(ours) == 800


MMMU_GOLDS = ["3", "3.14", "1,000", "-2", "0.5", "x", "red", "Paris", "24/7", "1e3", "12 kg", "a"]
MMMU_STEMS = ["{g}", "The answer is {g}.", "so the result is {g}", "x = {g}", "I think it could be {g}, not 4",
              "Answer: {g}\nbecause", "{g} kg", "It is {w}.", "The value is about {g}0", "Therefore, {g}.",
              "Final answer {g}", "three", "The answer is: ", "is so {g}", "{g}%", "approximately {g}.0"]


def test_mmmu_open_matches_the_mmmu_task():
    rng = random.Random(12)
    items, answers = [], []
    for i in range(600):
        gold, other = rng.choice(MMMU_GOLDS), rng.choice(MMMU_GOLDS)
        items.append(BenchItem(benchmark="mmmu", index=str(i), question="Q?", images=[], answer=gold))
        answers.append(rng.choice(MMMU_STEMS).format(g=rng.choice([gold, other]), w=other.upper()))
    # each decided by one quirk: a trivial tail is dropped, an empty tail gives way to the next key phrase
    for answer, gold in [("The answer is : ", "a"), ("answer is \n7", "is"), ("it is so \nthus 5", "so"),
                         ("x = 2\ny = 3", "2"), ("Result: 1,234.5 units", "1234.5"), (" 5 \n", "5")]:
        items.append(BenchItem(benchmark="mmmu", index=str(len(items)), question="Q?", images=[], answer=gold))
        answers.append(answer)
    _compare_mmmu_open(items, wrapped(answers, 12))


def test_mmmu_open_list_golds_match_eval_open_any_element():
    """A list-typed gold (meta["answers"]): lmms-eval's eval_open accepts any element. A gold written as a
    list in a text cell stays a string in lmms-eval (`doc["answer"]`), and so in ours."""
    rng = random.Random(13)
    lists = [["3", "three"], ["0.5", "1/2"], ["Paris", "paris, france"], ["24/7", "3.43"], ["1,000", "1000.0"],
             ["x", "y"], ["a"], ["12 kg", "12"], ["red", "crimson", "scarlet"]]
    typed, written = ([], []), ([], [])   # (items, answers): a list-typed column; a list literal in text
    for i in range(500):
        golds, other = rng.choice(lists), rng.choice(lists)
        items, answers = typed if i % 2 else written
        meta = {"answers": golds} if i % 2 else {}
        answer = golds[0] if i % 2 else str(golds)
        items.append(BenchItem(benchmark="mmmu", index=str(i), question="Q?", images=[], answer=answer, meta=meta))
        word = rng.choice(golds + other)
        answers.append(rng.choice(MMMU_STEMS).format(g=word, w=word.upper()))
    written[0].append(BenchItem(benchmark="mmmu", index="999", question="Q?", images=[], answer="['3', 'three']"))
    written[1].append("three")
    _compare_mmmu_open(*typed, listed=True)
    ours = _compare_mmmu_open(*written)
    assert ours[-1].score == 0.0                                      # "three": wrong in the harness
    lenient = scorer_for("mmmu", "lenient").score(written[0][-1:], written[1][-1:])
    assert lenient[0].score == 1.0                                    # our lenient reading parses the list


# (response, gold, lmms-eval 0.7.3's score): a list gold is a list-typed `answer` column, any element of
# which counts (`eval_open`); a string gold is a text cell, kept as text even when it reads like a list
MMMU_LIST_GOLD_CASES = [
    ("three", ["3", "three"], 1.0),                   # the string element "three" is in the tail "three"
    ("The answer is 3.", ["3", "three"], 1.0),        # tail "3" -> 3.0, equal to the element "3" -> 3.0
    ("four", ["3", "three"], 0.0),
    ("so the answer is THREE", ["3", "three"], 1.0),  # both sides lower-cased
    ("x = 0.50", ["1/2", "0.5"], 1.0),                # 0.50 and "0.5" both round to 0.5
    ("It is 1/2.", ["1/2", "0.5"], 1.0),
    ("It is y", ["x", "y"], 1.0),                     # one-letter tail and gold both padded: " y" in " y"
    ("the box", ["x", "y"], 0.0),                     # neither " x" nor "x " is inside "the box"
    ("anything at all", [], 0.0),                     # an empty list accepts nothing
    ("three", "['3', 'three']", 0.0),                 # a text cell: its literal text is not in "three"
    ("The answer is 3.", "['3', 'three']", 0.0),
    ("It is ['3', 'three']", "['3', 'three']", 1.0),  # ... but is in this tail
    ("four", "['3', 'three']", 0.0),
]


def _mmmu_parquet(tmp_path, name, gold):
    """A one-row MMMU parquet (lmms-eval's layout) whose `answer` column holds `gold` as given."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buf, format="PNG")
    answer_type = pa.list_(pa.string()) if isinstance(gold, list) else pa.string()
    table = pa.table({"id": ["validation_Math_1"], "question": ["How many?"], "options": ["[]"],
                      "answer": pa.array([gold], answer_type), "question_type": ["open"],
                      "image_1": [{"bytes": buf.getvalue(), "path": "1.png"}]})
    pq.write_table(table, tmp_path / f"{name}.parquet")
    return tmp_path / f"{name}.parquet"


@pytest.mark.parametrize("response, gold, expected", MMMU_LIST_GOLD_CASES)
def test_mmmu_open_list_gold_cases(response, gold, expected, tmp_path):
    """Each case read from an MMMU parquet by our reader and scored by our scorer, against lmms-eval's own
    task on the same document (the `answer` cell as the parquet holds it) and the hand-worked score."""
    from lmms_eval.tasks.mmmu.utils import evaluate_mmmu

    from protege.eval.readers import read_benchmark

    items = read_benchmark("mmmu", _mmmu_parquet(tmp_path, "case", gold))
    ours = scorer_for("mmmu").score(items, [response])[0].score
    doc_item = BenchItem(benchmark="mmmu", index="1", question="How many?", images=[], answer=gold)
    theirs = evaluate_mmmu([run_task("mmmu", [doc_item], [response])[0]["mmmu_acc"]])[1]["acc"]
    assert (ours, theirs) == (expected, expected)


def _compare_mmmu_open(items, answers, listed=False):
    from lmms_eval.tasks.mmmu.utils import evaluate_mmmu

    ours = scorer_for("mmmu").score(items, answers)
    harness_items = items
    if listed:  # the documents a list-typed answer column would hold
        harness_items = [BenchItem(benchmark="mmmu", index=it.index, question=it.question, images=[],
                                   answer=it.meta.get("answers") or it.answer) for it in items]
    theirs = [evaluate_mmmu([r["mmmu_acc"]])[1]["acc"] for r in run_task("mmmu", harness_items, answers)]
    bad = [f"{a!r} gold {it.meta.get('answers') or it.answer!r}: ours {s.score}, lmms-eval {t}"
           for it, a, s, t in zip(items, answers, ours, theirs) if s.score != t]
    assert not bad, "\n".join(bad[:20])
    return ours


# --- MMBench / MMBench-CN without a judge: eval_result("openai") with its API unreachable ------------

MMBENCH_EDGE = ["It is A and it is", "A or B", "答案是B", "**B**", "B。", "选B", "(B)", "B.", "Answer: B", "答案：B",
                "B\n", " B ", "<think>A</think>B", "B</think>", "I choose B", "b", "Option B", "B)", ":B", "B,",
                "(B).", "A B", "E", "banana", "The answer is pear", "香蕉", "Failed to obtain answer via API B",
                "I see A small cat", "B because A is wrong", "B\n\nA", "<think>B</think>", "**(B)**", "[B]", "B:"]


def mmbench_groups(benchmark, n_groups, seed, edge):
    """Circular groups of four rotated copies; the first `len(edge)` groups hang on one edge answer."""
    texts = ["apple", "banana", "cherry", "grape"]
    rng = random.Random(seed)
    pool = awkward_answers(2000, seed)
    items, preds = [], []
    for g in range(n_groups):
        gold_text = rng.choice(texts)
        for k in range(4):
            opts = {letter: texts[(i + k) % 4] for i, letter in enumerate("ABCD")}
            gold = next(letter for letter, t in opts.items() if t == gold_text)
            items.append(BenchItem(benchmark=benchmark, index=str(g + k * 1_000_000), question="Which fruit?",
                                   images=[], answer=gold, options=opts, group=str(g), category=f"g{g}"))
            if g < len(edge):
                preds.append(edge[g] if k == 0 else gold)
            else:
                preds.append(rng.choice([gold, gold_text, rng.choice(pool), rng.choice(pool)]))
    return items, preds


def harness_mmbench_groups(benchmark, items, preds, eval_method="openai"):
    """Per-group hit of lmms-eval's own aggregation (`eval_result`, as mmbench_*_dev_results_eval calls it,
    or with "static" as mmbench_en_dev_static's aggregation does): each group is its own category, so the
    category hit rates are the groups' outcomes."""
    from lmms_eval.tasks.mmbench.mmbench_evals import MMBench_Evaluator

    results = [r["gpt_eval_score"] for r in run_task(benchmark, items, preds)]
    _, by_category, _ = MMBench_Evaluator().eval_result(results, eval_method=eval_method)
    return {c[1:]: hit for c, hit in by_category.items()}


@pytest.mark.parametrize("benchmark", ["mmbench", "mmbench_cn"])
def test_mmbench_without_a_judge_matches_eval_result(benchmark, monkeypatch):
    import requests
    from lmms_eval.tasks.mmbench import mmbench_evals

    def unreachable(self, payload):
        raise requests.ConnectionError("no judge configured")

    monkeypatch.setattr(mmbench_evals.MMBench_Evaluator, "_post_request", unreachable)
    monkeypatch.setattr(mmbench_evals.time, "sleep", lambda s: None)
    monkeypatch.setattr(mmbench_evals.rd, "randint", lambda lo, hi: hi)  # its guess: "E", never the gold
    items, preds = mmbench_groups(benchmark, 150, 4 if benchmark == "mmbench" else 5, MMBENCH_EDGE)
    scorer = scorer_for(benchmark)
    scored = scorer.score(items, preds)
    units = {u.id: u.score for u in scorer.units(items, scored)}
    # without a judge MMBench-EN is mmbench_en_dev_static; MMBench-CN has no static task
    method = "static" if benchmark == "mmbench" else "openai"
    theirs = harness_mmbench_groups(benchmark, items, preds, method)
    bad = [f"group {g} {[(it.answer, p) for it, p in zip(items, preds) if it.group == g]}: ours {units[g]}, "
           f"lmms-eval {theirs[g]} (eval_result {method}, API unreachable)" for g in units if units[g] != theirs[g]]
    assert not bad, "\n".join(bad[:10])
    by_index = {it.index: s for it, s in zip(items, scored)}
    for g, p in enumerate(MMBENCH_EDGE[:5]):  # answers can_infer cannot read, each alone in its group
        first = by_index[str(g)]
        if benchmark == "mmbench_cn":
            assert (first.score, first.note) == (0.0, "unmatched (lmms-eval draws a random letter)"), p
    if benchmark == "mmbench":  # "**B**" (group 3) is read as B by the static task, right or wrong
        assert by_index["3"].extracted == "B" and by_index["3"].note.startswith("static fallback")
        assert "mmbench_en_dev_static" in scorer.protocol
    assert 0 < sum(units.values()) < len(units)

    # the benchmark's overall score: the mean over groups, as eval_result's overall hit rate
    assert sum(units.values()) / len(units) == pytest.approx(sum(theirs.values()) / len(theirs))
