"""Peak resident memory of one RIL step at a real vocabulary's width, whole-batch against micro-batched.

Fixed work: the tiny Qwen2-VL student (params.yaml `model` sizes, hidden 64) freshly initialised from seed 0,
its vocabulary grown to Qwen2.5's 151,936 rows (embeddings and LM head), a discriminator on the same
backbone; one `ril` step of 32 questions x (4 student samples + 4 teacher answers), 64 new tokens at most, on
the CPU. Each configuration runs in a fresh process; its peak resident set size (ru_maxrss) is printed, with
the step's seconds, the number of micro-batches and the largest weight difference to the whole-batch run.

    .venv/bin/python benchmarks/rl_memory.py [--questions 32] [--vocab 151936] [--threads 2]

Configurations: `whole` (micro_batch_tokens 2^30: the step's 256 rows in one forward), `derived` (unset:
the budget derived from the model's shape), and `tokens=N` for each --tokens N (default 4096).
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
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
from protege.world.questions import make_item
from protege.world.teachers import all_templates, scripted_answer

G, NEW_TOKENS = 4, 64


def grown(student, vocab: int):
    """The student with `vocab` rows of embeddings and LM head; the new LM-head rows are zero, so sampling
    (top-k 50) keeps to the tokenizer's own tokens and every sampled id decodes."""
    old = student.get_output_embeddings().weight.shape[0]
    student.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():
        student.get_output_embeddings().weight[old:] = 0.0
    student.config.get_text_config().vocab_size = vocab
    return student


def one_run(args, tokens: int | None, out: Path) -> dict:
    torch.set_num_threads(args.threads)
    world = out / "world"
    generate_world(WorldConfig(n_train=8, n_rl=args.questions, n_val=4, n_test=4), world)
    rows = load_rows(world / "rl.parquet")[:args.questions]
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    texts = [i.question for i in items] + [i.answer for i in items] + all_templates() * 5
    processor = StudentProcessor.create(train_tokenizer(texts, 400), 64, 8, 2)
    student = grown(build_student(ModelConfig(), processor, seed=0), args.vocab)
    answers = {r.id: [(style, scripted_answer(style, r.kind, r.answer, r.candidates, r.id, k, 0.0, 0))
                      for k in range(2) for style in ("concise", "verbose")] for r in rows}
    torch.manual_seed(1)
    disc = Discriminator(copy.deepcopy(student.model))
    cfg = RLConfig(algorithm="ril", steps=1, questions_per_step=args.questions, group_size=G,
                   max_new_tokens=NEW_TOKENS, save_every=1, device="cpu", micro_batch_tokens=tokens)
    logs: list[dict] = []
    t0 = time.perf_counter()
    run_rl(student, copy.deepcopy(student), processor, RLInputs(rows, answers, disc), cfg, out / "rl", seed=0,
           on_log=lambda s, m: logs.append(m))
    seconds = time.perf_counter() - t0
    torch.save({k: v for k, v in student.state_dict().items()}, out / "weights.pt")
    return {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "seconds": seconds,
            "micro_batches": logs[-1]["micro_batches"], "loss": logs[-1]["loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, action="append", help="a fixed micro-batch budget to measure too")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # one configuration in this process (the child)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only is not None:
        tokens = None if args.only == "derived" else 1 << 30 if args.only == "whole" else int(args.only)
        print(json.dumps(one_run(args, tokens, args.out)))
        return
    configs = ["whole", "derived", *[str(t) for t in (args.tokens or [4096])]]
    print(f"one ril step: {args.questions} questions x ({G} + {G}), {NEW_TOKENS} new tokens, vocabulary "
          f"{args.vocab:,}, hidden 64, CPU, {args.threads} threads")
    results, weights = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in configs:
            out = Path(tmp) / name
            out.mkdir()
            cmd = [sys.executable, __file__, "--only", name, "--out", str(out), "--questions", str(args.questions),
                   "--vocab", str(args.vocab), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                peak = "killed (out of memory?)" if done.returncode < 0 else f"exit {done.returncode}"
                print(f"{name:>10}: {peak}; {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
                continue
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            weights[name] = torch.load(out / "weights.pt", weights_only=True)
    base = weights.get("whole")
    for name, r in results.items():
        diff = (max(float((weights[name][k] - base[k]).abs().max()) for k in base) if base is not None else float("nan"))
        print(f"{name:>10}: peak RSS {r['peak_rss_gb']:.2f} GB, {r['seconds']:.1f} s, {r['micro_batches']:.0f} "
              f"micro-batch(es), loss {r['loss']:+.6f}, max |weight - whole| {diff:.2e}")


if __name__ == "__main__":
    main()
