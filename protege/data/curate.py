"""Curation of the RL pool (RIL's data recipe): overlong filtering, then log-probability sampling.

Overlong filtering counts what the model will see: chat template + image tokens + question + answer,
with the student's own tokenizer and image processor. Log-probability sampling scores each remaining
question by the SFT student's mean token log-prob of the reference answer and keeps a subset that
favours what the student finds hard (low log-prob), by one of three rules.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from protege.data.loader import image_batches
from protege.data.rows import ImageFiles, Row, read_table, stand_ins
from protege.models.logprobs import scored_positions
from protege.models.processor import StudentProcessor

RULES = ("softmax", "stratified", "lowest")
PROGRESS_EVERY = 64  # rows between reports while measuring token lengths


def with_token_lengths(table: Path, processor: StudentProcessor,
                       progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """The table plus `tokens`: chat-formatted prompt + image tokens + answer, as the student sees them. The
    image is a blank one of the file's size (read from its header): its tokens depend on the size alone."""
    df = read_table(table)
    lengths = []
    for i, rec in enumerate(df.to_dict("records")):
        files = ImageFiles(Path(table), i, rec["id"], (rec["image"],))
        lengths.append(processor.token_length(rec["question"], rec["answer"], stand_ins(files)))
        if progress and ((i + 1) % PROGRESS_EVERY == 0 or i + 1 == len(df)):
            progress(i + 1, len(df))
    return df.assign(tokens=lengths)


def answer_tokens(processor: StudentProcessor, answer: str) -> int:
    return len(processor.tokenizer(answer, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def answer_logprobs(model, processor: StudentProcessor, rows: list[Row], batch_size: int,
                    progress: Callable[[int, int], None] | None = None, workers: int = 0) -> list[float]:
    """Mean token log-prob of each reference answer under the model (end-of-turn token excluded). `workers`:
    processes decoding the next batches' images (protege.data.loader)."""
    model.eval()
    stops = torch.tensor(processor.stop_token_ids)
    out: list[float] = []
    batches = image_batches(rows, batch_size, workers)
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        batch = processor.encode_pairs([r.question for r in chunk], next(batches), [r.answer for r in chunk])
        mask = batch.pop("answer_mask")
        targets = batch["input_ids"][:, 1:]  # position t predicts token t+1
        m = (mask[:, 1:] == 1) & ~torch.isin(targets, stops)  # [B, T-1]
        logp, _, _ = scored_positions(model, batch, 0, m)  # the answer's positions only, the head in chunks
        out += ((logp * m).sum(1) / m.sum(1).clamp(min=1)).tolist()
        if progress:
            progress(min(i + batch_size, len(rows)), len(rows))
    return out


def select_by_logprob(logprobs: np.ndarray, k: int, rule: str, tau: float = 1.0, buckets: int = 4,
                      seed: int = 0) -> np.ndarray:
    """Indices of the k questions to keep (sorted). Low log-prob = hard for the student.

    softmax:    sample without replacement with p_i proportional to exp(-logprob_i / tau)
    stratified: equal draws from `buckets` log-prob quantile buckets (the remainder to the hardest)
    lowest:     the k lowest log-probs
    """
    n = len(logprobs)
    if k >= n:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    if rule == "lowest":
        return np.sort(np.argsort(logprobs, kind="stable")[:k])
    if rule == "softmax":
        z = -np.asarray(logprobs, dtype=np.float64) / tau
        p = np.exp(z - z.max())
        p /= p.sum()
        if (p > 0).sum() < k:  # tau so small that fewer than k have any mass: the rule's limit is lowest-k
            return np.sort(np.argsort(logprobs, kind="stable")[:k])
        return np.sort(rng.choice(n, size=k, replace=False, p=p))
    if rule == "stratified":
        order = np.argsort(logprobs, kind="stable")
        groups = np.array_split(order, buckets)
        share = [k // buckets + (1 if b < k % buckets else 0) for b in range(buckets)]
        chosen, spill = [], 0
        for g, s in zip(groups, share):
            take = min(len(g), s + spill)
            spill = s + spill - take
            chosen += list(rng.choice(g, size=take, replace=False))
        return np.sort(np.array(chosen, dtype=int))
    raise ValueError(f"unknown selection rule {rule!r}; expected one of {RULES}")


def stratum_quotas(strata: list[tuple[str, str]], k: int) -> dict[tuple[str, str], int]:
    """How many of k to keep from each (kind, answer) stratum so that answers stay balanced.

    Each kind gets a share of k proportional to its size in the pool, split equally between its answers
    (largest remainders first, in sorted order so the split is deterministic); a stratum smaller than
    its quota gives what it has.
    """
    by_kind: dict[str, dict[str, int]] = {}
    for kind, answer in strata:
        by_kind.setdefault(kind, {}).setdefault(answer, 0)
        by_kind[kind][answer] += 1
    n = len(strata)
    quotas: dict[tuple[str, str], int] = {}
    kinds = sorted(by_kind)
    kind_share = _largest_remainder({kd: k * sum(by_kind[kd].values()) / n for kd in kinds})
    for kd in kinds:
        answers = sorted(by_kind[kd])
        share = _largest_remainder({a: kind_share[kd] / len(answers) for a in answers})
        for a in answers:
            quotas[(kd, a)] = min(share[a], by_kind[kd][a])
    return quotas


def _largest_remainder(exact: dict[str, float]) -> dict[str, int]:
    out = {key: math.floor(v + 1e-9) for key, v in exact.items()}
    left = round(sum(exact.values())) - sum(out.values())
    for key in sorted(exact, key=lambda x: (-(exact[x] - out[x]), x))[:max(0, left)]:
        out[key] += 1
    return out


def select_balanced(logprobs: np.ndarray, strata: list[tuple[str, str]], k: int, rule: str, tau: float = 1.0,
                    buckets: int = 4, seed: int = 0) -> np.ndarray:
    """Log-probability sampling inside each (kind, answer) stratum, with the quotas of `stratum_quotas`,
    so the kept subset prefers hard questions without letting any answer become a prior worth learning."""
    quotas = stratum_quotas(strata, k)
    chosen = []
    for j, (key, quota) in enumerate(sorted(quotas.items())):
        members = np.array([i for i, s in enumerate(strata) if s == key], dtype=int)
        if quota:
            chosen += list(members[select_by_logprob(logprobs[members], quota, rule, tau, buckets, seed + j)])
    return np.sort(np.array(chosen, dtype=int))


def histogram(before: list[float], after: list[float], bins: int = 20) -> pd.DataFrame:
    """Counts of a quantity over shared bins, before and after curation (for PNG and DVC plots)."""
    lo, hi = min(before), max(before)
    if math.isclose(lo, hi):
        hi = lo + 1.0
    edges = np.linspace(lo, hi, bins + 1)
    return pd.DataFrame({"bin": np.round((edges[:-1] + edges[1:]) / 2, 4),
                         "pool": np.histogram(before, edges)[0], "selected": np.histogram(after, edges)[0]})


def plot_histograms(hists: dict[str, pd.DataFrame], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(hists), figsize=(5 * len(hists), 3.5))
    for ax, (name, h) in zip(np.atleast_1d(axes), hists.items()):
        width = (h["bin"].iloc[1] - h["bin"].iloc[0]) if len(h) > 1 else 1.0
        ax.bar(h["bin"], h["pool"], width=width, alpha=0.5, label="pool")
        ax.bar(h["bin"], h["selected"], width=width * 0.6, alpha=0.8, label="selected")
        ax.set_title(name)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
