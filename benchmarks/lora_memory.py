"""Optimizer memory of LoRA against full fine-tuning: trainable parameters and AdamW state bytes after one
step, on the embedded world's tiny student (default) or any checkpoint folder.

    python benchmarks/lora_memory.py                       # the world's tiny Qwen2-VL
    python benchmarks/lora_memory.py --model /ckpt/folder  # your own (loads it twice, on the CPU)
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def world_student():
    from protege.config import ModelConfig
    from protege.models.processor import StudentProcessor
    from protege.models.student import build_student
    from protege.models.tokenizer import train_tokenizer
    from protege.world.questions import make_item
    from protege.world.teachers import all_templates

    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(200)]
    texts = [i.question for i in items] + [i.answer for i in items] + all_templates() * 5
    processor = StudentProcessor.create(train_tokenizer(texts, 512), 64, 8, 2)
    return (lambda: build_student(ModelConfig(), processor, seed=0)), processor, items


def one_step(model, processor, items) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    batch = processor.encode_pairs([i.question for i in items[:8]], [i.images[0] for i in items[:8]],
                                   [i.answer for i in items[:8]])
    mask = batch.pop("answer_mask")
    t0 = time.perf_counter()
    logits = model(**batch).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["input_ids"][:, 1:].reshape(-1),
                                             reduction="none")
    (loss * mask[:, 1:].reshape(-1)).sum().backward()
    opt.step()
    seconds = time.perf_counter() - t0
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    return {"trainable_params": sum(p.numel() for p in params), "optimizer_state_bytes": state,
            "gradient_bytes": sum(p.numel() * p.element_size() for p in params), "step_s": seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="a checkpoint folder (default: the world's tiny student)")
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    from protege.models.lora import add_lora

    if args.model is None:
        make, processor, items = world_student()
    else:
        from protege.models.student import load_student
        from protege.world.questions import make_item

        make = lambda: load_student(args.model)[0]  # noqa: E731
        processor = load_student(args.model)[1]
        rng = random.Random(0)
        items = [make_item(rng, 64) for _ in range(8)]
    full = one_step(make(), processor, items)
    lora = one_step(add_lora(make(), args.rank, 2 * args.rank, 0.0, "auto"), processor, items)
    total = sum(p.numel() for p in make().parameters())
    print(f"parameters: {total:,}")
    for name, r in (("full", full), (f"lora r{args.rank}", lora)):
        print(f"{name:>9}: trainable {r['trainable_params']:>9,}  AdamW state {r['optimizer_state_bytes'] / 2**20:8.3f} MiB"
              f"  gradients {r['gradient_bytes'] / 2**20:8.3f} MiB  step {r['step_s'] * 1000:6.1f} ms")
    print(f"LoRA / full optimizer state: {lora['optimizer_state_bytes'] / full['optimizer_state_bytes']:.4f}")


if __name__ == "__main__":
    main()
