"""A study's statistics: means and paired differences with 95% CIs over seeds AND items, and verdicts.

A run's metric is the unweighted mean of one or more *parts*: the world's test split (one part), one
benchmark (one part), or the 14-benchmark average (one part per benchmark). A part holds per-unit scores
in [0, 1] (a unit: a question, or one MMBench circular group) and is aggregated like the benchmark
reports it: "micro" (mean over units) or "macro" (mean over categories of category means, MMStar).
Figures are in percent points.

The bootstrap has two levels. Each replicate draws the seeds with replacement and, independently, the
units of every part with replacement (each part on its own, as `protege.eval.stats.average_ci` does).
Every seed answers the same units (a crossed design), so one unit draw serves all seeds of a replicate:
drawing units anew for each seed would average the item noise away across seeds and understate it.
With one seed the seed level draws that seed every time and the CI is the unit-level CI.

A paired difference B - A pairs runs by seed (a variant that runs once, like the SFT row, is paired
with every seed of the other) and units by id, and resamples the pairs and units together.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protege.eval.stats import LEVEL, percentile_ci

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


@dataclass
class Part:
    scores: dict[str, float]               # unit id -> score in [0, 1]
    aggregate: str = "micro"               # micro | macro
    categories: dict[str, str] | None = None  # unit id -> category (macro only)
    percent: bool = True                   # False: scores are figures of their own (e.g. entropy in nats)


Run = dict[str, Part]                      # part name -> Part (a run's metric)


def verdict(ci: tuple[float, float] | list[float], margin: float = 0.0) -> str:
    """A claim "B > A" from the CI of B - A: above zero -> reproduced; below zero -> not reproduced (the
    opposite holds); a CI that touches or crosses zero -> inconclusive. With a margin m > 0 the claim is
    "B >= A" (B is not worse than A by more than m): the same rule with -m in place of 0."""
    lo, hi = ci
    if lo > -margin:
        return REPRODUCED
    if hi < -margin:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def pair_runs(seeds_a: list[int], seeds_b: list[int], once_a: bool = False, once_b: bool = False
              ) -> list[tuple[int, int]]:
    """Index pairs (i in A, j in B): the same seed on both sides; a side that runs once whatever the seed
    (`once_*`: a variant with `train: false`) pairs its run with every run of the other side."""
    if once_a and len(seeds_a) == 1:
        return [(0, j) for j in range(len(seeds_b))]
    if once_b and len(seeds_b) == 1:
        return [(i, 0) for i in range(len(seeds_a))]
    pairs = [(i, seeds_b.index(s)) for i, s in enumerate(seeds_a) if s in seeds_b]
    if not pairs:
        raise ValueError(f"no seed in common: {seeds_a} vs {seeds_b}")
    return pairs


def _part_scores(X: np.ndarray, W: np.ndarray, codes: np.ndarray | None, n_cat: int) -> np.ndarray:
    """Percent scores of rows X [P, N] under unit weights W [B, N] (counts of a resample) -> [B, P]."""
    if codes is None:
        return 100 * (W @ X.T) / W.sum(axis=1, keepdims=True)
    onehot = np.eye(n_cat)[codes]                          # [N, K]
    num = np.einsum("bn,pn,nk->bpk", W, X, onehot)         # weighted sums per category
    den = W @ onehot                                       # [B, K] weights per category
    present = den > 0
    means = np.where(present[:, None, :], num / np.maximum(den, 1e-12)[:, None, :], 0.0)
    return 100 * means.sum(axis=2) / present.sum(axis=1, keepdims=True)


def _aligned(parts_a: list[Part | None], parts_b: list[Part]) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None, int]:
    """The units every run of the part scored, as rows [P, N] for A (None: no A side) and B."""
    runs = [p for p in parts_a + parts_b if p is not None]
    ids = sorted(set.intersection(*(set(p.scores) for p in runs)))
    if not ids:
        raise ValueError("the runs share no scored unit")
    XA = np.array([[p.scores[i] for i in ids] for p in parts_a], dtype=float) if parts_a[0] is not None else None
    XB = np.array([[p.scores[i] for i in ids] for p in parts_b], dtype=float)
    first = parts_b[0]
    if first.aggregate != "macro":
        return XA, XB, None, 0
    cats = sorted({(first.categories or {}).get(i, "") for i in ids})
    codes = np.array([cats.index((first.categories or {}).get(i, "")) for i in ids])
    return XA, XB, codes, len(cats)


def _estimate(rows_a: list[Run] | None, rows_b: list[Run], n_boot: int, seed: int, level: float) -> dict:
    """Mean over pairs of (mean over parts of score B - score A), with its two-level bootstrap CI."""
    names = sorted(set.intersection(*(set(r) for r in rows_b + (rows_a or []))))
    if not names:
        raise ValueError("the runs share no part (benchmark or split)")
    rng = np.random.default_rng(seed)
    n_pairs = len(rows_b)
    point = np.zeros(n_pairs)
    reps = np.zeros((n_boot, n_pairs))
    units = 0
    for name in names:
        XA, XB, codes, n_cat = _aligned([r[name] for r in rows_a] if rows_a else [None], [r[name] for r in rows_b])
        N = XB.shape[1]
        units += N
        ones = np.ones((1, N))
        W = rng.multinomial(N, np.full(N, 1.0 / N), size=n_boot).astype(float)  # [B, N] unit draw counts
        k = 1.0 if rows_b[0][name].percent else 0.01  # _part_scores reports percent
        point += k * (_part_scores(XB, ones, codes, n_cat)[0]
                      - (_part_scores(XA, ones, codes, n_cat)[0] if XA is not None else 0))
        reps += k * (_part_scores(XB, W, codes, n_cat) - (_part_scores(XA, W, codes, n_cat) if XA is not None else 0))
    point /= len(names)
    reps /= len(names)
    seeds = rng.integers(0, n_pairs, size=(n_boot, n_pairs))  # the seed level: pairs drawn with replacement
    replicates = np.take_along_axis(reps, seeds, axis=1).mean(axis=1)
    lo, hi = percentile_ci(replicates, level)
    return {"mean": float(point.mean()), "ci": [lo, hi], "per_seed": [float(v) for v in point],
            "seeds": n_pairs, "parts": len(names), "units": units}


def summarize(runs: list[Run], n_boot: int = 1000, seed: int = 0, level: float = LEVEL) -> dict:
    """A variant's metric over its runs (one per seed): mean, 95% CI over seeds and units, per-seed values."""
    if not runs:
        raise ValueError("no finished run")
    return _estimate(None, runs, n_boot, seed, level)


def paired_difference(runs_a: list[Run], seeds_a: list[int], runs_b: list[Run], seeds_b: list[int],
                      n_boot: int = 1000, seed: int = 0, level: float = LEVEL, once_a: bool = False,
                      once_b: bool = False) -> dict:
    """B - A in points: runs paired by seed, units by id; mean, 95% CI, per-pair values and the verdict
    on "B > A"."""
    if not runs_a or not runs_b:
        raise ValueError("no finished run on one side")
    pairs = pair_runs(seeds_a, seeds_b, once_a, once_b)
    out = _estimate([runs_a[i] for i, _ in pairs], [runs_b[j] for _, j in pairs], n_boot, seed, level)
    out["pairs"] = [[seeds_a[i], seeds_b[j]] for i, j in pairs]
    out["diff"] = out.pop("mean")
    out["verdict"] = verdict(out["ci"])
    return out
