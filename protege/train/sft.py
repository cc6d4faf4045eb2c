"""Supervised warm-up: cross-entropy on answer tokens only."""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

import torch

from protege.config import SFTConfig
from protege.data.rows import Row
from protege.models.processor import StudentProcessor


def answer_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean token cross-entropy over answer tokens (prompt and padding masked)."""
    inputs = {k: v for k, v in batch.items() if k != "answer_mask"}
    labels = batch["input_ids"].masked_fill(batch["answer_mask"] == 0, -100)
    return model(**inputs, labels=labels).loss


def lr_factor(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up over `warmup_steps`, then constant or cosine decay to 10% by the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_sft(model, processor: StudentProcessor, rows: list[Row], cfg: SFTConfig, seed: int,
              on_log: Callable[[int, dict], None] | None = None) -> dict:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: lr_factor(i, cfg))
    model.train()
    order: list[int] = []
    t0, running = time.perf_counter(), []
    for step in range(1, cfg.steps + 1):
        if len(order) < cfg.batch_size:  # reshuffle once per epoch
            fresh = list(range(len(rows)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[:cfg.batch_size], order[cfg.batch_size:]
        batch = processor.encode_pairs([rows[i].question for i in idx], [rows[i].image for i in idx],
                                       [rows[i].answer for i in idx])
        loss = answer_loss(model, batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"SFT loss is {loss.item()} at step {step}; lower sft.lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running.append(loss.item())
        if on_log and (step % cfg.log_every == 0 or step == cfg.steps):
            on_log(step, {"loss": sum(running) / len(running), "grad_norm": float(grad_norm),
                          "seconds_per_step": (time.perf_counter() - t0) / step})
            running = []
    return {"steps": cfg.steps, "seconds": time.perf_counter() - t0}
