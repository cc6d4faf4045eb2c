"""The evaluation report's SFT -> RL -> merged pieces: best constant answer, distinct answers, world test CIs,
paired differences and the markdown that says whether RL beats SFT, against values worked out by hand."""
import json

import pytest

from protege.eval.report import (
    best_constant,
    distinct_answers,
    markdown,
    paired_differences,
    verdict,
    world_summary,
)


def item(qid, kind, reference, prediction, correct, extracted=None):
    return {"id": qid, "kind": kind, "reference": reference, "prediction": prediction, "extracted": extracted,
            "correct": float(correct), "tokens": 2}


def test_best_constant_is_the_most_frequent_gold_answer():
    assert best_constant(["red", "Red.", "blue", "green"]) == ("red", 0.5)  # "Red." and "red" are one answer
    assert best_constant(["3", "4", "4", "4", "5"]) == ("4", 0.6)
    assert best_constant(["A"]) == ("a", 1.0)


def test_distinct_answers_use_the_extracted_answer_else_the_stripped_prediction():
    items = [item("1", "k", "B", "The answer is B", 1, extracted="B"),
             item("2", "k", "B", " b ", 1),                         # no extraction: prediction, normalised
             item("3", "k", "B", "I think C", 0, extracted="C"),
             item("4", "k", "3", "3.", 0), item("5", "k", "3", "3", 1)]
    assert distinct_answers(items) == 3  # b, c, 3


def test_world_summary_per_kind_and_ci():
    items = [item("c1", "count", "3", "3", 1), item("c2", "count", "3", "3", 1), item("c3", "count", "4", "3", 0),
             item("c4", "count", "5", "3", 0),
             item("o1", "option", "A", "A", 1, "A"), item("o2", "option", "B", "C", 0, "C")]
    w = world_summary({"accuracy": 0.5, "items": 6, "chance": 0.1}, items, n_boot=500, seed=0)
    count = w["per_kind"]["count"]
    assert count == {"accuracy": 0.5, "best_constant": 0.5, "best_constant_answer": "3", "distinct_answers": 1,
                     "n": 4}
    assert w["per_kind"]["option"]["distinct_answers"] == 2 and w["per_kind"]["option"]["best_constant"] == 0.5
    lo, hi = w["ci"]
    assert 0 <= lo < 0.5 < hi <= 1 and w["accuracy"] == 0.5 and w["items"] == 6


def _units(folder, model, per_bench):
    for bench, units in per_bench.items():
        (folder / model / bench).mkdir(parents=True)
        (folder / model / bench / "units.json").write_text(json.dumps(units))


def test_paired_differences_on_hand_made_items(tmp_path):
    world = {"sft": [item(str(i), "k", "1", "x", c) for i, c in enumerate([1, 0, 0, 0])],
             "rl_final": [item(str(i), "k", "1", "x", c) for i, c in enumerate([1, 1, 1, 0])],
             "merged": [item(str(i), "k", "1", "x", c) for i, c in enumerate([0, 0, 0, 0])]}
    _units(tmp_path, "sft", {"ai2d": {"1": 0.0, "2": 0.0}, "chartqa": {"1": 1.0, "2": 0.0}})
    _units(tmp_path, "rl_final", {"ai2d": {"1": 1.0, "2": 1.0}, "chartqa": {"1": 1.0, "2": 0.0}})
    _units(tmp_path, "merged", {"ai2d": {"1": 0.0, "2": 0.0}, "chartqa": {"1": 1.0, "2": 0.0}})
    d = paired_differences([("sft", "rl_final"), ("sft", "merged")], world, tmp_path, n_boot=2000, seed=0)
    rl = d["rl_final - sft"]
    assert (rl["a"], rl["b"]) == ("sft", "rl_final")
    # world: per-item differences 0, +1, +1, 0 -> +50 points; a resample can hold only the zeros
    assert rl["world_test"]["diff"] == pytest.approx(50.0) and rl["world_test"]["n"] == 4
    assert rl["world_test"]["ci"][0] == pytest.approx(0.0) and rl["world_test"]["verdict"] == "CI crosses zero"
    # benchmarks: ai2d +100 on both items (CI collapses), chartqa 0 -> the average +50 with CI [50, 50]
    assert rl["average"]["diff"] == pytest.approx(50.0) and rl["average"]["ci"] == pytest.approx([50.0, 50.0])
    assert rl["average"]["verdict"] == "CI above zero"
    merged = d["merged - sft"]
    assert merged["world_test"]["diff"] == pytest.approx(-25.0) and merged["average"]["diff"] == 0.0
    assert merged["average"]["verdict"] == "CI crosses zero"  # [0, 0]: not above, not below


def test_verdict():
    assert verdict([0.1, 3]) == "CI above zero" and verdict([-3, -0.1]) == "CI below zero"
    assert verdict([-1, 1]) == "CI crosses zero"


def _model(world_items, score, n_boot=200):
    bench = {"items": 2, "chance": 25.0, "score": score, "ci": [score - 5, score + 5], "per_category": {},
             "per_difficulty": {}, "notes": {}}
    acc = sum(i["correct"] for i in world_items) / len(world_items)
    return {"path": "m", "average": score, "average_ci": [score - 5, score + 5], "benchmarks": {"ai2d": bench},
            "mean_tokens": 2.0, "mean_latency_s": 0.01, "seconds_per_answer": 0.001,
            "world_test": world_summary({"accuracy": acc, "items": len(world_items), "chance": 0.25}, world_items,
                                        n_boot)}


def test_markdown_puts_the_progression_and_the_verdict_first(tmp_path):
    world = {"sft": [item(str(i), "count", "3", "3", i < 2) for i in range(8)],
             "rl_final": [item(str(i), "count", "3", "3", True) for i in range(8)]}
    report = {"suite": "mini", "protocol": "lmms-eval", "bootstrap": 200, "benchmarks": {"ai2d": "f"},
              "candidate": "rl_final", "score": 60.0,
              "models": {"sft": _model(world["sft"], 40.0), "rl_final": _model(world["rl_final"], 60.0)}}
    _units(tmp_path, "sft", {"ai2d": {"1": 0.0, "2": 0.0}})
    _units(tmp_path, "rl_final", {"ai2d": {"1": 1.0, "2": 1.0}})
    report["differences"] = paired_differences([("sft", "rl_final")], world, tmp_path, n_boot=200)
    md = markdown(report)
    assert md.index("## sft -> rl_final") < md.index("## Benchmarks")
    assert "**rl_final - sft**: world test split +75.0 points" in md and "`rl_final` beats `sft`" in md
    assert "| count: accuracy (n=8; best constant 1.000, \"3\") | 0.250 | 1.000 |" in md
    assert "| count: distinct answers | 1 | 1 |" in md
    assert "| rl_final - sft | +75.0 |" in md and "CI above zero" in md
    # a report of one model without world test figures (`eval run`) has no such section
    del report["differences"]
    for m in report["models"].values():
        del m["world_test"]
    assert "## sft -> rl_final" not in markdown(report) and "| **average** |" in markdown(report)
