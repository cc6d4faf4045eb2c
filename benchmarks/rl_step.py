"""Seconds per RL step, samples/s and tokens/s of the RL loop, for `dr_grpo` and `ril`.

Fixed work: the tiny Qwen2-VL student (params.yaml `model` sizes) freshly initialised from seed 0,
8 questions x G=4 samples (+4 teacher answers for ril), 16 new tokens at most, on the CPU.

    .venv/bin/python benchmarks/rl_step.py [--steps 5]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
from pathlib import Path

import torch

from protege.config import ModelConfig, RLConfig, WorldConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.rl.loop import RLInputs, run_rl
from protege.world.generate import generate_world
from protege.world.teachers import all_templates, scripted_answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per algorithm (after one warm-up step)")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    with tempfile.TemporaryDirectory() as tmp:
        frames = generate_world(WorldConfig(n_train=200, n_rl=64, n_test=8), Path(tmp))
        texts = list(frames["train"]["question"]) + list(frames["train"]["answer"]) + all_templates() * 20
        processor = StudentProcessor.create(train_tokenizer(texts, 512), 64, 8, 2)
        student = build_student(ModelConfig(), processor, seed=0)
        rows = load_rows(Path(tmp) / "rl.parquet")
        answers = {r.id: [(t, scripted_answer(t, r.kind, r.answer, r.candidates, r.id, k, 0.1, 0))
                          for t in ("concise", "verbose") for k in range(4)] for r in rows}
        print(f"threads {torch.get_num_threads()}; student {sum(p.numel() for p in student.parameters()):,} params")
        results = {}
        for algorithm in ("dr_grpo", "ril"):
            cfg = RLConfig(algorithm=algorithm, steps=args.steps + 1, questions_per_step=8, group_size=4,
                           max_new_tokens=16, save_every=10_000)
            logs: list[dict] = []
            policy = copy.deepcopy(student)
            disc = Discriminator(copy.deepcopy(student.model)) if algorithm == "ril" else None
            run_rl(policy, copy.deepcopy(student), processor, RLInputs(rows, answers, disc), cfg,
                   Path(tmp) / algorithm, seed=0, on_log=lambda s, m: logs.append(m))
            timed = logs[1:]  # the first step pays one-off costs
            sps = [m["samples_per_s"] for m in timed]
            tps = [m["tokens_per_s"] for m in timed]
            samples = 8 * 4 * (2 if algorithm == "ril" else 1)
            results[algorithm] = {"seconds_per_step": statistics.median(samples / s for s in sps),
                                  "samples_per_s": statistics.median(sps), "tokens_per_s": statistics.median(tps)}
            r = results[algorithm]
            print(f"{algorithm:8s} {r['seconds_per_step']:.3f} s/step  {r['samples_per_s']:.1f} samples/s  "
                  f"{r['tokens_per_s']:.1f} tokens/s  (median of {len(timed)} steps, {samples} sequences/step)")
        print(json.dumps(results))


if __name__ == "__main__":
    main()
