"""Batched vs one-at-a-time generation on the 14 mini benchmarks: seconds, answers/s, speed-up.

Fixed work: every item of the world's mini benchmarks (params.yaml `evaluate.mini_items` each), greedy,
`evaluate.max_new_tokens` new tokens at most, answered by a student checkpoint (default models/sft,
which `make demo` writes), on the CPU with 2 threads.

    .venv/bin/python benchmarks/eval_batching.py [--model models/sft] [--batch-size 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from protege.config import load_config
from protege.bench.items import BENCHMARKS
from protege.eval.runner import generate_predictions
from protege.models.student import load_student
from protege.world.benchmarks import make_mini_benchmark


def timed(model, processor, items, batch_size: int, max_new_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    preds = generate_predictions(model, processor, items, batch_size, max_new_tokens)
    return time.perf_counter() - t0, sum(p.tokens for p in preds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path("models/sft"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not (args.model / "model.safetensors").exists():
        sys.exit(f"{args.model}: no checkpoint; run `make demo` first or pass --model PATH")
    torch.set_num_threads(2)
    cfg = load_config(args.params)
    avoid: set[str] = set()
    items = [it for name in BENCHMARKS
             for it in make_mini_benchmark(name, cfg.world.seed, cfg.world.image_size, cfg.evaluate.mini_items, avoid)]
    model, processor = load_student(args.model)
    max_new = cfg.evaluate.max_new_tokens
    timed(model, processor, items[:8], args.batch_size, max_new)  # warm-up
    results = {}
    for bs in (args.batch_size, 1):
        runs = [timed(model, processor, items, bs, max_new) for _ in range(args.repeats)]
        secs = statistics.median(r[0] for r in runs)
        results[bs] = secs
        print(f"batch size {bs:>3}: {secs:7.2f} s for {len(items)} answers (median of {args.repeats}), "
              f"{len(items) / secs:7.1f} answers/s, {runs[0][1] / secs:8.1f} tokens/s")
    print(f"speed-up of batch size {args.batch_size} over one at a time: {results[1] / results[args.batch_size]:.1f}x")


if __name__ == "__main__":
    main()
