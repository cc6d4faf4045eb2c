"""How many weight elements 10 AdamW steps move, with `model.dtype: bfloat16` against float32: plain AdamW on
the bf16 weights (what the updater did before fp32 master weights) rounds most small updates away; the
updater's fp32 masters keep them. The embedded world's tiny Qwen2-VL student, SFT's answer loss, the same
batches for every run, on the CPU.

    python benchmarks/bf16_updates.py                 # lr 1e-4 and 1e-5, 10 steps
    python benchmarks/bf16_updates.py --steps 20 --lr 1e-5

A weight element counts as moved when it differs from its starting value (for the bf16 runs: the bf16 weight
the model holds, which generation, scoring and checkpoints read; for the master run also the fp32 master).
"(stored bf16)" is the fp32 run's weights rounded to bf16: what a bf16 model can show of the fp32 run's
updates after these steps, the figure the bf16 weights of the master run are to be read against.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lora_memory import world_student  # noqa: E402  (the tiny world's student, as the LoRA benchmark builds it)


class PlainAdamW:
    """The updater before master weights: torch AdamW straight on the model's (bf16) parameters."""

    def __init__(self, params, lr: float, clip: float = 1.0):
        self.params, self.clip = params, clip
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def update(self, loss: torch.Tensor) -> None:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run(start, processor, batches, dtype: str, updater_kind: str, lr: float) -> dict:
    from protege.models.precision import with_precision
    from protege.runtime.updaters import TorchUpdater
    from protege.train.sft import answer_loss

    model = with_precision(copy.deepcopy(start), dtype)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    updater = TorchUpdater(model, params, lr) if updater_kind == "masters" else PlainAdamW(params, lr)
    t0 = time.perf_counter()
    for batch, images in batches:
        updater.update(answer_loss(model, batch, images))
    seconds = (time.perf_counter() - t0) / len(batches)
    total = sum(p.numel() for p in params)
    out = {"moved": sum(int((p.detach() != b).sum()) for p, b in zip(params, before)) / total,
           "moved_in_bf16": sum(int((p.detach().bfloat16() != b.bfloat16()).sum()) for p, b in zip(params, before))
           / total, "s_per_step": seconds}
    if updater_kind == "masters":
        out["master_moved"] = sum(int((m.detach() != b.float()).sum())
                                  for m, b in zip(updater.masters, before)) / total
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, action="append", help="(repeatable; default 1e-4 and 1e-5)")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    from protege.models.precision import bf16_native

    torch.manual_seed(0)
    build, processor, items = world_student()
    student = build()
    start = student.to(torch.bfloat16).float()  # one start every run holds exactly, bf16 or fp32
    batches = []
    for s in range(args.steps):
        chosen = items[s * args.batch:(s + 1) * args.batch]
        images = processor.image_lists([i.images for i in chosen])
        batches.append((processor.encode_pairs([i.question for i in chosen], images, [i.answer for i in chosen]),
                        images))
    total = sum(p.numel() for p in start.parameters())
    print(f"tiny Qwen2-VL student, {total:,} weights, {args.steps} AdamW steps (batch {args.batch}, clip 1.0, "
          f"no weight decay), torch {torch.__version__}, bf16 autocast on this CPU: {bf16_native('cpu')}")
    for dtype, kind in (("float32", "masters"), ("bfloat16", "plain"), ("bfloat16", "masters")):  # warm-up
        run(start, processor, batches[:1], dtype, kind, 1e-4)
    print(f"{'lr':>7} | {'float32':>8} | {'(stored bf16)':>13} | {'bf16, AdamW on bf16 weights':>27} | "
          f"{'bf16 + fp32 masters':>19} | {'(the masters)':>13} | s/step fp32 / bf16 / masters")
    for lr in args.lr or [1e-4, 1e-5]:
        full = run(start, processor, batches, "float32", "masters", lr)  # fp32: the updater steps in place
        plain = run(start, processor, batches, "bfloat16", "plain", lr)
        masters = run(start, processor, batches, "bfloat16", "masters", lr)
        print(f"{lr:>7.0e} | {full['moved']:>8.1%} | {full['moved_in_bf16']:>13.1%} | {plain['moved']:>27.1%} | "
              f"{masters['moved']:>19.1%} | {masters['master_moved']:>13.1%} | {full['s_per_step']:.3f} / "
              f"{plain['s_per_step']:.3f} / {masters['s_per_step']:.3f}")


if __name__ == "__main__":
    main()
