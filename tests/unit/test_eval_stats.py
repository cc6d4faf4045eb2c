"""Benchmark scores, bootstrap CIs and the paired bootstrap, against values worked out by hand."""
import math

import pytest

from protege.errors import UserFacingError
from protege.eval.compare import compare
from protege.bench.items import Unit
from protege.eval.stats import auroc, average_ci, bootstrap_ci, paired_bootstrap, score_of


def units(scores, cats=None):
    cats = cats or [""] * len(scores)
    return [Unit(str(i), s, c) for i, (s, c) in enumerate(zip(scores, cats))]


def test_micro_and_macro_scores():
    u = units([1, 0, 1, 1, 1], ["a", "a", "b", "b", "b"])
    assert score_of(u, "micro") == pytest.approx(80.0)          # 4 of 5
    assert score_of(u, "macro") == pytest.approx(75.0)          # (50 + 100) / 2
    assert math.isnan(score_of([], "micro"))


def test_bootstrap_ci_brackets_the_score_and_collapses_when_constant():
    u = units([1, 0] * 20)
    lo, hi = bootstrap_ci(u, "micro", n_boot=2000, seed=1)
    # binomial: sd of the mean = sqrt(.25 / 40) = 7.9 points -> 95% CI about 50 +- 15.5
    assert 30 < lo < 40 and 60 < hi < 70
    assert bootstrap_ci(units([1] * 10), "micro") == (100.0, 100.0)
    lo, hi = bootstrap_ci(units([1, 0, 1, 1, 1], ["a", "a", "b", "b", "b"]), "macro", n_boot=500)
    assert 0 <= lo <= 75 <= hi <= 100


def test_average_is_the_unweighted_mean_of_benchmark_scores():
    per = {"x": (units([1, 1, 1, 1]), "micro"), "y": (units([0, 0]), "micro"), "z": ([], "micro")}
    avg, lo, hi = average_ci(per, n_boot=200)
    assert avg == pytest.approx(50.0) and lo == pytest.approx(50.0) and hi == pytest.approx(50.0)


def test_paired_bootstrap_on_hand_example():
    a = {"x": 1.0, "y": 0.0, "z": 0.0, "only_a": 1.0}
    b = {"x": 1.0, "y": 1.0, "z": 0.0}
    r = paired_bootstrap(a, b, n_boot=4000, seed=0)
    assert r["n"] == 3 and r["only_a"] == 1 and r["only_b"] == 0
    assert r["diff"] == pytest.approx(100 / 3) and r["a"] == pytest.approx(100 / 3)
    # B is not better exactly when the resample misses y: (2/3)^3 = 0.296
    assert r["p_b_not_better"] == pytest.approx(8 / 27, abs=0.03)
    assert r["ci"][0] == pytest.approx(0.0) and r["ci"][1] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="no scored item in common"):
        paired_bootstrap({"p": 1.0}, {"q": 1.0})


def test_compare_two_evaluations():
    a = {"ai2d": {"1": 1.0, "2": 0.0}, "chartqa": {"1": 0.0, "2": 0.0}}
    b = {"ai2d": {"1": 1.0, "2": 1.0}, "chartqa": {"1": 0.0, "2": 0.0}, "mmvet": {"1": 1.0}}
    r = compare(a, b, n_boot=500)
    assert r["benchmarks"]["ai2d"]["diff"] == pytest.approx(50.0)
    assert r["average"]["diff"] == pytest.approx(25.0) and r["only_b"] == ["mmvet"]


def test_compare_leaves_out_benchmarks_without_common_items_and_warns_on_other_files():
    a = {"ai2d": {"1": 1.0, "2": 0.0}, "mmmu": {"validation_Art_1": 1.0}}
    b = {"ai2d": {"1": 1.0, "2": 1.0}, "mmmu": {"validation_Math_1": 0.0}}
    r = compare(a, b, n_boot=200, sources_a={"ai2d": "/x/ai2d.tsv"}, sources_b={"ai2d": "/y/AI2D_TEST.tsv"})
    assert list(r["benchmarks"]) == ["ai2d"]
    assert any("mmmu" in w and "no scored item in common" in w for w in r["warnings"])
    assert any("AI2D_TEST.tsv" in w for w in r["warnings"])
    with pytest.raises(UserFacingError, match="share no benchmark"):
        compare({"mmmu": {"p": 1.0}}, {"mmmu": {"q": 1.0}})


def test_chance_of_guessing_a_listed_option():
    from protege.bench.items import BenchItem
    from protege.eval.score import chance_score

    four = {"A": "a", "B": "b", "C": "c", "D": "d"}
    items = [BenchItem("ai2d", "1", "q", [], "A", options=four),
             BenchItem("ai2d", "2", "q", [], "A", options={"A": "a", "B": "b"}),
             BenchItem("ai2d", "3", "q", [], "7")]                        # open: no guess scores
    assert chance_score(items, "micro") == pytest.approx((25 + 50 + 0) / 3)
    copies = [BenchItem("mmbench", str(k * 1_000_000), "q", [], "A", options=four, group="0") for k in range(4)]
    assert chance_score(copies, "micro") == pytest.approx(100 * 0.25 ** 4)  # every copy right: 0.39


def test_auroc_by_hand():
    # positives 0.9, 0.4 against negatives 0.4, 0.1: 0.9 wins twice, 0.4 ties 0.4 (half) and beats 0.1 -> 3.5 / 4
    assert auroc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == pytest.approx(0.875)
    # scores crowded at 0.5 still separate by rank, where a 0.5 threshold calls every answer one class
    assert auroc([0.5004, 0.5003, 0.4998, 0.4997], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert auroc([0.2, 0.8], [1, 0]) == pytest.approx(0.0)
    assert math.isnan(auroc([0.3, 0.6], [1, 1]))
