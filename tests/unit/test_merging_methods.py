"""Every merge method against values computed by hand (in the comments), on small hand-written tensors."""
import math

import pytest
import torch

from protege.merging import methods as M
from protege.merging.streaming import merge_state_dicts

T = torch.tensor


def close(a, b, tol=1e-6):
    assert torch.allclose(a.float(), T(b, dtype=torch.float32) if not isinstance(b, torch.Tensor) else b.float(),
                          atol=tol, rtol=0), f"{a} != {b}"


# ------------------------------------------------------------------ linear

def test_linear_normalized_and_not():
    a, b = T([1.0, 2.0]), T([3.0, 6.0])
    # (1*[1,2] + 3*[3,6]) / (1+3) = [10, 20] / 4
    close(M.linear([a, b], [1.0, 3.0]), [2.5, 5.0])
    close(M.linear([a, b], [1.0, 3.0], normalize=False), [10.0, 20.0])
    close(M.linear(torch.stack([a, b]), 1.0), [2.0, 4.0])  # stacked input, one weight for all
    assert M.linear([a.to(torch.bfloat16), b.to(torch.bfloat16)], [1, 1]).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="sum to 0"):
        M.linear([a, b], [1.0, -1.0])
    with pytest.raises(ValueError, match="expected 2 values"):
        M.linear([a, b], [1.0, 2.0, 3.0])


# ------------------------------------------------------------------ task arithmetic

BASE3 = T([1.0, 1.0, 1.0])
M1 = T([2.0, 0.0, 1.0])  # d1 = [1, -1, 0]
M2 = T([1.0, 3.0, 3.0])  # d2 = [0, 2, 2]


def test_task_arithmetic():
    # base + 0.5 d1 + 1 d2 = [1.5, 2.5, 3]
    close(M.task_arithmetic([M1, M2], [0.5, 1.0], base=BASE3), [1.5, 2.5, 3.0])
    # lambda 2: base + 2 [0.5, 1.5, 2] = [2, 4, 5]
    close(M.task_arithmetic([M1, M2], [0.5, 1.0], base=BASE3, lambda_=2.0), [2.0, 4.0, 5.0])
    # normalize: [0.5, 1.5, 2] / 1.5 = [1/3, 1, 4/3]
    close(M.task_arithmetic([M1, M2], [0.5, 1.0], base=BASE3, normalize=True), [4 / 3, 2.0, 7 / 3])
    # task vectors in, merged task vector out
    close(M.task_arithmetic([M1 - BASE3, M2 - BASE3], [0.5, 1.0]), [0.5, 1.5, 2.0])


def test_defaults_match_mergekit_registry():
    S = {n: M.METHODS[n].shared for n in M.METHODS}
    assert S["linear"] == {"normalize": True}
    assert S["task_arithmetic"]["normalize"] is False and S["task_arithmetic"]["rescale"] is False
    assert S["ties"]["normalize"] is True and S["ties"]["rescale"] is False
    assert S["dare_ties"]["normalize"] is False and S["dare_ties"]["rescale"] is True
    assert S["dare_linear"]["normalize"] is False and S["dare_linear"]["rescale"] is True
    assert S["breadcrumbs"]["normalize"] is False and S["breadcrumbs_ties"]["normalize"] is False
    for n in ("task_arithmetic", "ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties"):
        assert S[n]["lambda"] == 1.0 and S[n]["int8_mask"] is False
        assert M.METHODS[n].per_model["density"] == 1.0 and M.METHODS[n].per_model["weight"] is M.REQUIRED
    assert M.METHODS["breadcrumbs"].per_model["gamma"] == 0.01


# ------------------------------------------------------------------ TIES: 3 task vectors of length 5, density 0.6

D1 = T([0.5, -2.0, 0.1, 3.0, -0.4])   # keep int(0.6*5)=3 largest |.|: 3, -2, 0.5 -> [0.5, -2, 0, 3, 0]
D2 = T([-1.0, 1.5, -0.2, 2.0, 0.3])   # 2, 1.5, -1 -> [-1, 1.5, 0, 2, 0]
D3 = T([0.2, -0.1, 1.0, -2.5, 0.7])   # -2.5, 1, 0.7 -> [0, 0, 1, -2.5, 0.7]
W = [1.0, 2.0, 1.0]
# weighted: [0.5,-2,0,3,0], [-2,3,0,4,0], [0,0,1,-2.5,0.7]; sum = [-1.5, 1, 1, 4.5, 0.7] -> signs [-,+,+,+,+]
# agreeing entries per position: 0: -2 (w 2) -> -1 | 1: 3 (w 2) -> 1.5 | 2: 1 (w 1) -> 1 | 3: 3+4 (w 1+2) -> 7/3
# 4: 0.7 (w 1) -> 0.7
TIES_NORM = [-1.0, 1.5, 1.0, 7 / 3, 0.7]
TIES_SUM = [-2.0, 3.0, 1.0, 7.0, 0.7]


def test_magnitude_trim():
    close(M.magnitude_prune(D1, 0.6), [0.5, -2.0, 0.0, 3.0, 0.0])
    close(M.magnitude_prune(D1, 1.0), D1)
    close(M.magnitude_prune(D1, 0.1), [0, 0, 0, 3.0, 0])  # max(1, int(0.5)) = 1 entry kept
    # L1 rescale: |D1|_1 = 6, kept |.|_1 = 5.5 -> x 6/5.5
    close(M.magnitude_prune(D1, 0.6, rescale=True), [0.5 * 6 / 5.5, -2 * 6 / 5.5, 0, 3 * 6 / 5.5, 0])


def test_ties_closed_form():
    base = T([1.0, 1.0, 1.0, 1.0, 1.0])
    ms = [base + D1, base + D2, base + D3]
    close(M.ties(ms, W, 0.6, base=base), [1 + v for v in TIES_NORM], 1e-5)
    close(M.ties(ms, W, 0.6, base=base, normalize=False), [1 + v for v in TIES_SUM], 1e-5)
    close(M.ties(ms, W, 0.6, base=base, lambda_=0.5), [1 + 0.5 * v for v in TIES_NORM], 1e-5)
    # the merged teacher's call: stacked task vectors, weight tensor, density -> merged task vector
    close(M.ties(torch.stack([D1, D2, D3]), torch.tensor(W), 0.6), TIES_NORM, 1e-5)
    # per-model densities: model 3 keeps everything -> position 0: signs sum -1.5+0.2 < 0 -> only -2 (w 2)
    out = M.ties([D1, D2, D3], W, [0.6, 0.6, 1.0])
    assert out[0].item() == pytest.approx(-1.0)


def test_ties_count_consensus():
    # signs of the weighted trimmed vectors: pos0 (+,-,0) count 0 -> + elected -> 0.5/1; pos1 (-,+,0) -> + -> 3/2
    close(M.ties([D1, D2, D3], W, 0.6, consensus="count"), [0.5, 1.5, 1.0, 7 / 3, 0.7], 1e-5)


# ------------------------------------------------------------------ DARE

def test_dare_density_one_is_task_arithmetic():
    g = torch.Generator().manual_seed(0)
    state = g.get_state().clone()
    close(M.dare_linear([M1, M2], [0.5, 1.0], 1.0, base=BASE3, generator=g), [1.5, 2.5, 3.0])
    assert torch.equal(g.get_state(), state)  # nothing drawn at density 1
    # dare_ties at density 1: weighted [0.5,-0.5,0], [0,2,2]; sum [0.5,1.5,2] all +; agreeing:
    # pos0 0.5, pos1 2, pos2 2; no normalisation by default -> base + [0.5, 2, 2]
    close(M.dare_ties([M1, M2], [0.5, 1.0], 1.0, base=BASE3, generator=g), [1.5, 3.0, 3.0])
    close(M.dare_ties([M1, M2], [0.5, 1.0], 1.0, base=BASE3, normalize=True), [1 + 0.5 / 0.5, 1 + 2 / 1, 1 + 2 / 1])


def test_dare_seeded_equals_masked_rescaled_sum():
    base = torch.zeros(6)
    d1 = T([1.0, -2.0, 3.0, -4.0, 5.0, -6.0])
    d2 = T([0.5, 0.5, -1.0, 1.0, 2.0, -2.0])
    # the masks the method draws: Bernoulli(0.5) from a generator seeded 7, model 1 first, then model 2
    g = torch.Generator().manual_seed(7)
    m1 = torch.bernoulli(torch.full((6,), 0.5), generator=g)
    m2 = torch.bernoulli(torch.full((6,), 0.5), generator=g)
    assert 0 < m1.sum() < 6 and 0 < m2.sum() < 6  # this seed keeps some and drops some of each

    def kept(d, m):  # d*m rescaled to d's L1 norm (mergekit's rescale, not 1/density)
        return d * m * (d.abs().sum() / (d * m).abs().sum())

    expected = 2.0 * kept(d1, m1) + 1.0 * kept(d2, m2)
    out = M.dare_linear([base + d1, base + d2], [2.0, 1.0], 0.5, base=base,
                        generator=torch.Generator().manual_seed(7))
    close(out, expected, 1e-5)
    # dropped entries of a model contribute nothing
    assert torch.all(out[(m1 == 0) & (m2 == 0)] == 0)
    # dare_ties: sign election over the same rescaled vectors
    w1, w2 = 2.0 * kept(d1, m1), kept(d2, m2)
    sign = torch.where(w1 + w2 >= 0, 1.0, -1.0)
    expected_ties = w1 * (w1.sign() == sign) + w2 * (w2.sign() == sign)
    close(M.dare_ties([d1, d2], [2.0, 1.0], 0.5, generator=torch.Generator().manual_seed(7)), expected_ties, 1e-5)
    # same seed, same result; another seed, another mask
    a = M.dare_linear([d1, d2], [1, 1], 0.5, generator=torch.Generator().manual_seed(1))
    b = M.dare_linear([d1, d2], [1, 1], 0.5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_bernoulli_rescale_off():
    d = T([1.0, 2.0, 3.0, 4.0])
    g = torch.Generator().manual_seed(3)
    m = torch.bernoulli(torch.full((4,), 0.5), generator=torch.Generator().manual_seed(3))
    close(M.bernoulli_prune(d, 0.5, rescale=False, generator=g), d * m)


# ------------------------------------------------------------------ breadcrumbs

B1 = T([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8, 0.9, -1.0])
B2 = T([-1.0, 0.9, -0.8, 0.7, -0.6, 0.5, -0.4, 0.3, -0.2, 0.1])
# density 0.5, gamma 0.2, n=10: keep 5, drop the 2 largest |.| and the 10-5-2 = 3 smallest
K1 = [0, 0, 0, -0.4, 0.5, -0.6, 0.7, -0.8, 0, 0]
K2 = [0, 0, -0.8, 0.7, -0.6, 0.5, -0.4, 0, 0, 0]


def test_breadcrumbs_sparsification():
    close(M.magnitude_outliers_prune(B1, 0.5, 0.2), K1)
    close(M.magnitude_outliers_prune(B2, 0.5, 0.2), K2)
    # density 0.9, gamma 0.2: 9 kept, 10-9-2 < 0 -> only the 1 largest dropped
    close(M.magnitude_outliers_prune(B1, 0.9, 0.2), [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8, 0.9, 0])
    # gamma 0: plain magnitude trim
    close(M.magnitude_outliers_prune(B1, 0.3, 0.0), [0] * 7 + [-0.8, 0.9, -1.0])


def test_breadcrumbs_and_ties():
    base = torch.ones(10)
    # K1 + K2 = [0,0,-0.8,0.3,-0.1,-0.1,0.3,-0.8,0,0]
    close(M.breadcrumbs([base + B1, base + B2], [1.0, 1.0], 0.5, 0.2, base=base),
          [1 + a + b for a, b in zip(K1, K2)], 1e-6)
    # ties: elected signs [+,+,-,+,-,-,+,-,+,+]; agreeing: 2: -0.8 | 3: 0.7 | 4: -0.6 | 5: -0.6 | 6: 0.7 | 7: -0.8
    close(M.breadcrumbs_ties([B1, B2], [1.0, 1.0], 0.5, 0.2), [0, 0, -0.8, 0.7, -0.6, -0.6, 0.7, -0.8, 0, 0], 1e-6)
    # weights scale, no normalisation by default
    close(M.breadcrumbs([B1], [2.0], 0.5, 0.2), [2 * v for v in K1])


# ------------------------------------------------------------------ slerp

def test_slerp_orthogonal_and_angles():
    r = math.sqrt(0.5)
    close(M.slerp(0.5, T([1.0, 0.0]), T([0.0, 1.0])), [r, r])
    # |v0|=2, |v1|=3, 90 degrees, t=1/3: sin(60)/1 * v0 + sin(30)/1 * v1 = [sqrt(3), 1.5]
    close(M.slerp(1 / 3, T([2.0, 0.0]), T([0.0, 3.0])), [math.sqrt(3), 1.5], 1e-5)
    # 60 degrees, unit vectors, t=0.5 -> the unit vector at 30 degrees
    close(M.slerp(0.5, T([1.0, 0.0]), T([0.5, math.sqrt(3) / 2])), [math.sqrt(3) / 2, 0.5], 1e-6)
    close(M.slerp(0.0, T([1.0, 0.0]), T([0.0, 1.0])), [1.0, 0.0])
    close(M.slerp(1.0, T([1.0, 0.0]), T([0.0, 1.0])), [0.0, 1.0])


def test_slerp_colinear_is_lerp():
    close(M.slerp(0.25, T([1.0, 2.0]), T([2.0, 4.0])), [1.25, 2.5])   # same direction
    close(M.slerp(0.5, T([1.0, 0.0]), T([-1.0, 0.0])), [0.0, 0.0])    # antipodal
    # whole tensor flattened: a 2x2 matrix, orthogonal as vectors
    out = M.slerp(0.5, T([[1.0, 0.0], [0.0, 0.0]]), T([[0.0, 0.0], [0.0, 1.0]]))
    assert out.shape == (2, 2)
    close(out.reshape(-1), [math.sqrt(0.5), 0, 0, math.sqrt(0.5)])


# ------------------------------------------------------------------ model stock

def test_model_stock_known_angle():
    s3 = math.sqrt(3)
    # offsets [1,0] and [0.5, sqrt3/2]: 60 degrees, cos 0.5; k=2: t = 2*0.5/(1+0.5) = 2/3
    # result = 2/3 * mean + 1/3 * base, mean = base + [0.75, sqrt3/4]
    base = T([1.0, 1.0])
    out = M.model_stock([base + T([1.0, 0.0]), base + T([0.5, s3 / 2])], base)
    close(out, [1 + 2 / 3 * 0.75, 1 + 2 / 3 * s3 / 4], 1e-6)
    # orthogonal offsets: cos 0 -> t 0 -> the base
    close(M.model_stock([base + T([1.0, 0.0]), base + T([0.0, 2.0])], base), [1.0, 1.0])
    # opposite offsets: 1 + (k-1) cos = 0 -> singular -> the base
    close(M.model_stock([base + T([1.0, 0.0]), base - T([1.0, 0.0])], base), [1.0, 1.0])
    # three models with pairwise cos 1 (same direction): mean cos 1 -> t = 3/3 = 1 -> the average
    close(M.model_stock([base + T([1.0, 0.0]), base + T([2.0, 0.0]), base + T([3.0, 0.0])], base), [3.0, 1.0])


def test_model_stock_filter_wise():
    s3 = math.sqrt(3)
    base = torch.zeros(2, 2)
    a = T([[1.0, 0.0], [1.0, 0.0]])
    b = T([[0.5, s3 / 2], [0.0, 1.0]])   # row 0: 60 degrees (t = 2/3); row 1: 90 degrees (t = 0)
    out = M.model_stock([a, b], base, filter_wise=True)
    close(out, T([[2 / 3 * 0.75, 2 / 3 * s3 / 4], [0.0, 0.0]]), 1e-6)
    # not filter-wise: one cos over the flattened offsets: <a,b> = 0.5 / (sqrt2 * sqrt2) = 0.25 -> t = 0.5/1.25
    t = 2 * 0.25 / 1.25
    close(M.model_stock([a, b], base), t * (a + b) / 2, 1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        M.model_stock([a], base)


# ------------------------------------------------------------------ ema, buffers, dispatch

def test_ema():
    close(M.ema(T([0.0, 10.0]), T([10.0, 0.0]), 0.1), [1.0, 9.0])
    with pytest.raises(ValueError):
        M.ema(T([0.0]), T([1.0]), 1.5)


def test_non_float_tensors_take_the_base_or_first():
    a, b, base = T([1, 2]), T([3, 4]), T([7, 7])
    assert torch.equal(M.merge_tensor("linear", [a, b], None, [{"weight": 1}, {"weight": 1}]), a)
    assert torch.equal(M.merge_tensor("ties", [a, b], base, [{"weight": 1}, {"weight": 1}]), base)


def test_merge_tensor_dispatch_and_defaults():
    base = torch.ones(5)
    ms = [base + D1, base + D2, base + D3]
    rows = [{"weight": w, "density": 0.6} for w in W]
    close(M.merge_tensor("ties", ms, base, rows), [1 + v for v in TIES_NORM], 1e-5)
    close(M.merge_tensor("ties", ms, base, rows, {"normalize": False}), [1 + v for v in TIES_SUM], 1e-5)
    close(M.merge_tensor("slerp", [T([0.0, 1.0])], T([1.0, 0.0]), [{}], {"t": 0.5}), [0.5**0.5] * 2)
    with pytest.raises(ValueError, match="'weight' is required"):
        M.merge_tensor("ties", ms, base, [{}, {}, {}])
    with pytest.raises(ValueError, match="unknown merge method"):
        M.merge_tensor("nope", ms, base, [{}, {}, {}])


def test_merge_state_dicts():
    base = {"w": torch.ones(5), "step": T(3)}
    states = [{"w": torch.ones(5) + d, "step": T(9)} for d in (D1, D2, D3)]
    out = merge_state_dicts("ties", states, base, {"weight": W, "density": 0.6})
    close(out["w"], [1 + v for v in TIES_NORM], 1e-5)
    assert out["step"].item() == 3
    lin = merge_state_dicts("linear", [{"w": T([1.0])}, {"w": T([3.0])}], parameters={"weight": [1.0, 3.0]})
    close(lin["w"], [2.5])
    with pytest.raises(ValueError, match="needs a base"):
        merge_state_dicts("ties", states)
    with pytest.raises(ValueError, match="different tensors"):
        merge_state_dicts("ties", [{"x": torch.ones(5)}], base, {"weight": 1})
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    d1 = merge_state_dicts("dare_ties", states, base, {"weight": 1, "density": 0.5}, g1)
    d2 = merge_state_dicts("dare_ties", states, base, {"weight": 1, "density": 0.5}, g2)
    assert torch.equal(d1["w"], d2["w"])


def test_consume_and_chunking_give_the_same_result(monkeypatch):
    base = torch.ones(5)
    want = M.ties([base + D1, base + D2, base + D3], W, 0.6, base=base)
    monkeypatch.setattr(M, "CHUNK", 4)  # 3 models -> one column per chunk
    inputs = [base + D1, base + D2, base + D3]
    got = M.merge_tensor("ties", inputs, base, [{"weight": w, "density": 0.6} for w in W], consume=True)
    assert torch.equal(got, want) and inputs == [None, None, None]
    assert torch.equal(base, torch.ones(5))  # the base is never written
    s3 = math.sqrt(3)
    ms = [T([2.0, 1.0]), T([1.5, 1 + s3 / 2])]
    want = M.model_stock([m.clone() for m in ms], T([1.0, 1.0]))
    assert torch.equal(M.merge_tensor("model_stock", ms, T([1.0, 1.0]), [{}, {}], consume=True), want)
    xs = [T([1.0, 2.0]), T([3.0, 6.0])]
    assert torch.equal(M.merge_tensor("linear", xs, None, [{"weight": 1}, {"weight": 3}], consume=True), T([2.5, 5.0]))
    assert xs == [None, None]
