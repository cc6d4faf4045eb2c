"""Log-probability sampling rules on known log-probs."""
import numpy as np
import pytest

from protege.data.curate import histogram, select_by_logprob

LOGPROBS = np.linspace(-5.0, 0.0, 200)  # index 0 is the hardest question


def test_lowest_k_takes_the_hardest():
    assert list(select_by_logprob(LOGPROBS[::-1], 3, "lowest")) == [197, 198, 199]


def test_softmax_with_small_tau_prefers_low_logprob():
    keep = select_by_logprob(LOGPROBS, 50, "softmax", tau=0.3, seed=0)
    assert len(set(keep)) == 50
    assert LOGPROBS[keep].mean() < LOGPROBS.mean() - 1.0


def test_softmax_with_large_tau_is_close_to_uniform():
    keep = select_by_logprob(LOGPROBS, 100, "softmax", tau=1e6, seed=0)
    assert abs(LOGPROBS[keep].mean() - LOGPROBS.mean()) < 0.5


def test_softmax_tau_to_zero_limit_is_lowest_k():
    assert list(select_by_logprob(LOGPROBS, 5, "softmax", tau=1e-9)) == [0, 1, 2, 3, 4]


def test_stratified_draws_equally_from_each_bucket():
    keep = select_by_logprob(LOGPROBS, 40, "stratified", buckets=4, seed=1)
    counts = np.bincount(keep // 50, minlength=4)  # 4 buckets of 50 sorted questions
    assert counts.tolist() == [10, 10, 10, 10]


def test_keep_everything_when_k_exceeds_pool_and_bad_rule():
    assert list(select_by_logprob(LOGPROBS[:3], 10, "softmax")) == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown selection rule"):
        select_by_logprob(LOGPROBS, 3, "random")


def test_histogram_counts_both_sides():
    h = histogram([0.0, 1.0, 2.0, 3.0], [0.0, 3.0], bins=3)
    assert h["pool"].sum() == 4 and h["selected"].sum() == 2


def test_balanced_selection_keeps_answers_equally_frequent():
    import numpy as np

    from protege.data.curate import select_balanced, stratum_quotas

    # kind a: answers x (6 rows), y (2 rows); kind b: one open stratum (4 rows)
    strata = [("a", "x")] * 6 + [("a", "y")] * 2 + [("b", "")] * 4
    quotas = stratum_quotas(strata, 6)
    assert quotas == {("a", "x"): 2, ("a", "y"): 2, ("b", ""): 2}  # a gets 4 of 6 (8/12), split 2 + 2
    logprobs = np.array([-0.1, -0.2, -3.0, -2.0, -0.3, -0.4, -1.0, -1.0, -5.0, -0.1, -0.2, -4.0])
    keep = select_balanced(logprobs, strata, 6, "lowest")
    assert list(keep) == [2, 3, 6, 7, 8, 11]  # the hardest two of each stratum


def test_quotas_never_exceed_a_stratum():
    from protege.data.curate import stratum_quotas

    quotas = stratum_quotas([("a", "x")] * 1 + [("a", "y")] * 9, 8)
    assert quotas == {("a", "x"): 1, ("a", "y"): 4}

