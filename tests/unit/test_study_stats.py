"""A study's statistics on hand-computed cases: verdicts, paired differences, the two-level bootstrap."""
import pytest

from protege.eval.stats import bootstrap_ci
from protege.bench.items import Unit
from protege.study.stats import Part, pair_runs, paired_difference, summarize, verdict


def run(scores, name="world_test", aggregate="micro", categories=None):
    return {name: Part({f"q{i}": float(s) for i, s in enumerate(scores)}, aggregate, categories)}


def test_verdict_rule():
    assert verdict([0.1, 2.0]) == "reproduced"
    assert verdict([-2.0, -0.1]) == "not reproduced"
    assert verdict([-1.0, 1.0]) == "inconclusive"
    assert verdict([0.0, 1.0]) == "inconclusive"  # touching zero is not above it
    assert verdict([0.0, 0.0]) == "inconclusive"  # identical models


def test_pairing_by_seed_and_broadcast_of_a_single_run():
    assert pair_runs([1, 2, 3], [1, 2, 3]) == [(0, 0), (1, 1), (2, 2)]
    assert pair_runs([3, 1], [1, 2, 3]) == [(0, 2), (1, 0)]
    assert pair_runs([1], [1, 2, 3], once_a=True) == [(0, 0), (0, 1), (0, 2)]  # the SFT row: evaluated once
    assert pair_runs([1, 2], [5], once_b=True) == [(0, 0), (1, 0)]
    with pytest.raises(ValueError, match="no seed in common"):
        pair_runs([1, 2], [3, 4])
    # a trained variant that has finished one seed so far pairs by seed only, never with every seed
    assert pair_runs([1], [1, 2, 3]) == [(0, 0)]
    with pytest.raises(ValueError, match="no seed in common"):
        pair_runs([1, 2], [5])


def test_mean_over_seeds_and_items_and_ci_contains_it():
    s = summarize([run([1, 0, 1, 1]), run([1, 1, 1, 1]), run([0, 0, 1, 1])], n_boot=2000)
    assert s["mean"] == pytest.approx(100 * (0.75 + 1.0 + 0.5) / 3)
    assert s["per_seed"] == [75.0, 100.0, 50.0] and s["seeds"] == 3 and s["units"] == 4
    assert s["ci"][0] < s["mean"] < s["ci"][1]


def test_constant_items_leave_only_the_seed_level():
    # every item of a seed scores the same: the item draw changes nothing, the seed draw is all there is.
    # 3 seeds at 60 / 70 / 80: a replicate is the mean of 3 draws; P(all 60) = 1/27 > 2.5%, so the CI is [60, 80]
    s = summarize([run([0.6] * 5), run([0.7] * 5), run([0.8] * 5)], n_boot=4000)
    assert s["mean"] == pytest.approx(70.0)
    assert s["ci"] == pytest.approx([60.0, 80.0])
    # two seeds at 0 and 100: replicates 0, 50, 100 with probabilities 1/4, 1/2, 1/4
    s = summarize([run([0] * 4), run([1] * 4)], n_boot=4000)
    assert s["mean"] == 50.0 and s["ci"] == pytest.approx([0.0, 100.0])


def test_one_seed_degenerates_to_the_item_bootstrap():
    scores = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1] * 4
    s = summarize([run(scores)], n_boot=4000)
    lo, hi = bootstrap_ci([Unit(str(i), float(v)) for i, v in enumerate(scores)], n_boot=4000)
    assert s["mean"] == pytest.approx(70.0)
    assert s["ci"][0] == pytest.approx(lo, abs=2.5) and s["ci"][1] == pytest.approx(hi, abs=2.5)
    assert summarize([run([1, 1, 1])])["ci"] == [100.0, 100.0]


def test_paired_difference_by_hand():
    # B fixes one of A's four items: +25 points. The per-item differences are [0, 1, 0, 0]; a replicate is
    # 25 x (number of draws of item 1): P(0) = (3/4)^4 = 32% -> CI low 0; P(>= 3) = 5.1% -> CI high 75
    a, b = run([1, 0, 1, 0]), run([1, 1, 1, 0])
    d = paired_difference([a], [7], [b], [7], n_boot=4000)
    assert d["diff"] == 25.0 and d["ci"] == pytest.approx([0.0, 75.0]) and d["verdict"] == "inconclusive"
    assert d["pairs"] == [[7, 7]]
    # items are paired by id: B's extra item is left out
    b_extra = {"world_test": Part({**b["world_test"].scores, "extra": 1.0})}
    assert paired_difference([a], [7], [b_extra], [7])["diff"] == 25.0


def test_paired_difference_verdicts_over_seeds():
    better = [run([1] * 8 + [0] * 2), run([1] * 9 + [0]), run([1] * 8 + [0] * 2)]
    worse = [run([1] * 2 + [0] * 8), run([1] * 3 + [0] * 7), run([1] * 2 + [0] * 8)]
    up = paired_difference(worse, [1, 2, 3], better, [1, 2, 3], n_boot=1000)
    assert up["diff"] == pytest.approx((60 + 60 + 60) / 3) and up["verdict"] == "reproduced"
    assert up["per_seed"] == pytest.approx([60.0, 60.0, 60.0])
    down = paired_difference(better, [1, 2, 3], worse, [1, 2, 3], n_boot=1000)
    assert down["diff"] == pytest.approx(-60.0) and down["verdict"] == "not reproduced"
    # a single baseline run (the SFT row) is paired with every seed
    single = paired_difference([worse[0]], [1], better, [1, 2, 3], n_boot=1000, once_a=True)
    assert single["per_seed"] == pytest.approx([60.0, 70.0, 60.0]) and single["pairs"] == [[1, 1], [1, 2], [1, 3]]


def test_benchmark_average_is_the_mean_of_benchmarks_and_macro_is_over_categories():
    # benchmark x: micro 50; benchmark y: macro over categories {c: [1, 0] -> 50, d: [1] -> 100} = 75
    r = {"x": Part({"1": 1.0, "2": 0.0}),
         "y": Part({"a": 1.0, "b": 0.0, "c": 1.0}, "macro", {"a": "c", "b": "c", "c": "d"})}
    s = summarize([r], n_boot=500)
    assert s["mean"] == pytest.approx((50 + 75) / 2) and s["parts"] == 2 and s["units"] == 5
    assert s["ci"][0] <= s["mean"] <= s["ci"][1]


def test_bootstrap_is_deterministic_for_a_seed():
    runs = [run([1, 0, 1, 0, 1]), run([0, 0, 1, 1, 1])]
    assert summarize(runs, seed=3) == summarize(runs, seed=3)


def test_verdict_with_a_margin_is_non_inferiority():
    # "B >= A" within 1 point: the CI of B - A against -1 instead of 0
    assert verdict([-0.9, 2.0], margin=1.0) == "reproduced"
    assert verdict([-1.0, 2.0], margin=1.0) == "inconclusive"  # touching -m is not above it
    assert verdict([-3.0, -1.1], margin=1.0) == "not reproduced"
    assert verdict([-0.9, 2.0]) == "inconclusive"  # the same CI without a margin
