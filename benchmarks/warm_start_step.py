"""Seconds per warm-start step with micro-batches of rows of like length against one whole-batch forward.

A step's rows differ in length (QA prompts by format, tool episodes by turns); one forward pads every row to
the longest. `runtime.micro.length_groups` sorts the rows and cuts them into micro-batches, each padded only
to its own longest row, where the padding saved outweighs FORWARD_OVERHEAD_TOKENS per extra forward. This
script times both on a finished project's base student and data (the demo's, after `make demo`), one
thread, and prints the real share of the padded tokens and the seconds per step (median of `--steps`).

    .venv/bin/python benchmarks/warm_start_step.py [--project .] [--steps 20] [--threads 1]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from protege.config import load_config
from protege.data.rows import load_rows
from protege.rollout.episodes import pack
from protege.rollout.games import expert_episodes
from protege.rollout.trajectory import answer_trajectory, thought_sft_loss, token_logprobs
from protege.runtime.micro import length_groups
from protege.stages.student_model import load_model
from protege.train.agent_sft import expert_as_episode
from protege.train.sft import answer_nll

WHOLE = 1 << 40  # an overhead no split can beat: one forward over the whole batch


def qa_batches(cfg, processor, root: Path, n: int, rng: random.Random):
    rows = load_rows(root / "data/world/train.parquet")
    for _ in range(n):
        pick = rng.sample(rows, cfg.sft.batch_size)
        images = processor.image_lists([r.image for r in pick])
        batch = processor.encode_pairs([r.question for r in pick], images, [r.sft_target for r in pick])
        yield answer_trajectory(batch, images), (lambda model, part: answer_nll(model, part))


def game_batches(game, image_size: int, processor, n: int, rng: random.Random):
    eps = [expert_as_episode(processor, t, game.context) for t in expert_episodes(game, image_size, 200)]
    rows = [r for e in eps for r in e.rows()]
    for _ in range(n):
        traj = pack(processor, rng.sample(rows, game.sft.batch_size))
        n_tok = float(traj.loss_mask.sum())
        yield traj, (lambda model, part, n_tok=n_tok: thought_sft_loss(token_logprobs(model, part),
                                                                        part.loss_mask.float(), tokens=n_tok))


def time_steps(model, processor, batches, overhead: int) -> tuple[float, float]:
    """(median seconds per forward + backward of a batch, real share of the padded tokens)."""
    secs, real, padded = [], 0, 0
    for traj, loss_of in batches:
        lengths = traj.inputs["attention_mask"].sum(dim=1).tolist()
        t0 = time.perf_counter()
        for rows in length_groups(lengths, 1 << 30, overhead):
            part = (traj if len(rows) == traj.n else traj.select(rows, processor)).trimmed(processor)
            loss_of(model, part).backward()
            real += int(part.inputs["attention_mask"].sum())
            padded += part.inputs["input_ids"].numel()
        secs.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return statistics.median(secs[1:] or secs), real / max(padded, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--project", type=Path, default=Path("."))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.project / "params.yaml")
    model, processor = load_model(cfg, args.project / "models/base")
    model.train()
    recipes = {"sft (QA)": lambda rng: qa_batches(cfg, processor, args.project, args.steps, rng),
               "agent_sft": lambda rng: game_batches(cfg.agent, cfg.world.image_size, processor, args.steps, rng),
               "tool_sft": lambda rng: game_batches(cfg.tool, cfg.world.image_size, processor, args.steps, rng)}
    print("| recipe | overhead (tokens) | real / padded tokens | s per step | vs whole batch |")
    print("|---|---|---|---|---|")
    for name, make in recipes.items():
        batches = list(make(random.Random(0)))
        time_steps(model, processor, batches[:3], WHOLE)  # warm-up: allocator and kernel caches
        base = None
        for overhead in (WHOLE, 1024, 512, 256, 128, 0, WHOLE):  # whole batch again last: the run's drift
            s, share = time_steps(model, processor, batches, overhead)
            base = base or s
            label = "whole batch" if overhead == WHOLE else str(overhead)
            print(f"| {name} | {label} | {share:.2f} | {s:.3f} | {s / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
