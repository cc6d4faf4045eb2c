"""Probe: how far a short SFT takes a student on the world, per question kind.

Builds the world (or reuses --world), trains the tokenizer and a tiny student with the given model
sizes, runs SFT for --steps, then reports per kind: greedy accuracy, the best constant answer's
accuracy and the number of distinct answers given. For sizing the world and the model, not a stage.
  python dev/probe_sft.py --steps 600 --hidden 64 --layers 2 --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from protege.config import ModelConfig, SFTConfig, WorldConfig
from protege.data.rows import load_rows
from protege.eval.accuracy import evaluate_rows
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.train.sft import train_sft
from protege.world.generate import generate_world
from protege.world.teachers import all_templates


def per_kind(items: list[dict]) -> dict:
    by = defaultdict(list)
    for it in items:
        by[it["kind"]].append(it)
    out = {}
    for kind, its in sorted(by.items()):
        gold = Counter(i["reference"] for i in its)
        said = Counter((i["extracted"] or i["prediction"].strip()) for i in its)
        out[kind] = {"acc": sum(i["correct"] for i in its) / len(its), "best_const": gold.most_common(1)[0][1] / len(its),
                     "distinct": len(said), "top": said.most_common(3), "n": len(its)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--vdepth", type=int, default=2)
    ap.add_argument("--vembed", type=int, default=32)
    ap.add_argument("--patch", type=int, default=8)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--n-train", type=int, default=4800)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--schedule", default="cosine")
    ap.add_argument("--wd", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    wcfg = WorldConfig(n_train=args.n_train, n_rl=480, n_val=192, n_test=960, image_size=args.image, vocab_size=1024)
    if not (out / "world" / "test.parquet").exists():
        generate_world(wcfg, out / "world")
    import pandas as pd
    train_df = pd.read_parquet(out / "world" / "train.parquet")
    tok = train_tokenizer(list(train_df["question"]) + list(train_df["answer"]) + all_templates() * 20, 1024)
    mcfg = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads, num_kv_heads=1,
                       intermediate_size=args.inter, vision_depth=args.vdepth, vision_embed_dim=args.vembed,
                       patch_size=args.patch)
    proc = StudentProcessor.create(tok, args.image, mcfg.patch_size, mcfg.merge_size)
    model = build_student(mcfg, proc, 0)
    print("params", sum(p.numel() for p in model.parameters()))
    train = load_rows(out / "world" / "train.parquet")
    test = load_rows(out / "world" / "test.parquet")
    t0 = time.time()
    state = {"items": []}

    def on_log(step, metrics):
        t1 = time.time()
        summary, items = evaluate_rows(model, proc, test, 64, 8)
        state["items"] = items
        print(f"step {step} loss {metrics['loss']:.3f} {metrics['seconds_per_step']:.3f}s/step eval {time.time() - t1:.0f}s "
              f"acc {summary['accuracy']:.3f}", flush=True)
        for k, v in per_kind(items).items():
            print(f"  {k:13s} acc {v['acc']:.2f} const {v['best_const']:.2f} distinct {v['distinct']} {v['top']}",
                  flush=True)

    train_sft(model, proc, train, SFTConfig(steps=args.steps, batch_size=args.batch, lr=args.lr, warmup_steps=args.warmup,
                                            schedule=args.schedule, log_every=args.eval_every or args.steps), 0,
              on_log=on_log)
    items = state["items"]
    json.dump(per_kind(items), open(out / "per_kind.json", "w"), indent=1)


if __name__ == "__main__":
    main()
