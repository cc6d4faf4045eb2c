"""Benchmark scores with bootstrap confidence intervals, and the paired bootstrap between two runs.

Scores are in percent (0-100) like published tables. The bootstrap resamples `Unit`s (a question, or
one MMBench circular group), so copies that are scored together are also resampled together.
"""
from __future__ import annotations

import numpy as np

from protege.bench.items import Unit

LEVEL = 0.95


def _macro(scores: np.ndarray, codes: np.ndarray, n_codes: int) -> np.ndarray:
    """[B, N] resampled scores and category codes -> [B] mean over present categories of their means."""
    sums = np.zeros((scores.shape[0], n_codes))
    counts = np.zeros((scores.shape[0], n_codes))
    for c in range(n_codes):
        hit = codes == c
        sums[:, c] = (scores * hit).sum(axis=1)
        counts[:, c] = hit.sum(axis=1)
    present = counts > 0
    means = np.where(present, sums / np.maximum(counts, 1), 0.0)
    return means.sum(axis=1) / present.sum(axis=1)


def auroc(scores, labels) -> float:
    """Probability that a random positive (label 1) outscores a random negative (label 0), ties counting half;
    NaN when either class is absent. Rank-based, so it reads a separation that a fixed threshold misses."""
    s, y = np.asarray(scores, dtype=float).ravel(), np.asarray(labels, dtype=float).ravel()
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]  # [P, N]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def score_of(units: list[Unit], aggregate: str = "micro") -> float:
    """100 x mean over units ("micro") or over categories of category means ("macro")."""
    if not units:
        return float("nan")
    scores = np.array([[u.score for u in units]])
    if aggregate == "macro":
        cats = sorted({u.category for u in units})
        codes = np.array([[cats.index(u.category) for u in units]])
        return float(100 * _macro(scores, codes, len(cats))[0])
    return float(100 * scores.mean())


def replicates(units: list[Unit], aggregate: str, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """[n_boot] bootstrap replicates of score_of(units)."""
    scores = np.array([u.score for u in units], dtype=float)
    idx = rng.integers(0, len(units), size=(n_boot, len(units)))
    if aggregate == "macro":
        cats = sorted({u.category for u in units})
        codes = np.array([cats.index(u.category) for u in units])
        return 100 * _macro(scores[idx], codes[idx], len(cats))
    return 100 * scores[idx].mean(axis=1)


def percentile_ci(reps: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    lo, hi = np.quantile(reps, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def bootstrap_ci(units: list[Unit], aggregate: str = "micro", n_boot: int = 1000, seed: int = 0,
                 level: float = LEVEL) -> tuple[float, float]:
    if not units:
        return float("nan"), float("nan")
    return percentile_ci(replicates(units, aggregate, n_boot, np.random.default_rng(seed)), level)


def average_ci(per_benchmark: dict[str, tuple[list[Unit], str]], n_boot: int = 1000, seed: int = 0,
               level: float = LEVEL) -> tuple[float, float, float]:
    """The unweighted mean of benchmark scores, with a CI from resampling each benchmark on its own."""
    rng = np.random.default_rng(seed)
    names = [n for n, (units, _) in per_benchmark.items() if units]
    if not names:
        return float("nan"), float("nan"), float("nan")
    avg = float(np.mean([score_of(*per_benchmark[n]) for n in names]))
    reps = np.mean([replicates(*per_benchmark[n], n_boot, rng) for n in names], axis=0)
    return (avg, *percentile_ci(reps, level))


def paired_bootstrap(a: dict[str, float], b: dict[str, float], n_boot: int = 1000, seed: int = 0,
                     level: float = LEVEL) -> dict:
    """B - A over the units both runs scored: mean difference (points), its CI, and the share of
    replicates in which B is not better than A (a one-sided bootstrap p-value)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two runs have no scored item in common")
    diff = np.array([b[k] - a[k] for k in shared], dtype=float) * 100
    idx = np.random.default_rng(seed).integers(0, len(shared), size=(n_boot, len(shared)))
    reps = diff[idx].mean(axis=1)
    lo, hi = percentile_ci(reps, level)
    return {"n": len(shared), "only_a": len(set(a) - set(b)), "only_b": len(set(b) - set(a)),
            "a": float(100 * np.mean([a[k] for k in shared])), "b": float(100 * np.mean([b[k] for k in shared])),
            "diff": float(diff.mean()), "ci": [lo, hi], "p_b_not_better": float((reps <= 0).mean())}
