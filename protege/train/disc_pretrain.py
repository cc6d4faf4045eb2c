"""Discriminator pretraining: BCE with student answers -> 1 and answers of any teacher -> 0.

It runs on the shared training runtime as sft does: device, torch or DeepSpeed updates, a training state
every disc_pretrain.save_every steps for exact resume, and several processes (each a slice of every batch,
the loss a mean over the whole batch; micro-batches of disc_pretrain.micro_batch_tokens) under torchrun with backend deepspeed.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from protege.config import DiscPretrainConfig, result_params
from protege.data.loader import consecutive, decoded_batches
from protege.data.rows import ImageSource
from protege.errors import UserFacingError
from protege.eval.stats import auroc
from protege.models.discriminator import Discriminator
from protege.models.processor import StudentProcessor
from protege.runtime.distributed import all_reduce_sum, barrier, world
from protege.runtime.micro import budget_tokens, rank_length_groups
from protege.runtime.placement import resolve_device, to_device
from protege.runtime.run import Run, due
from protege.runtime.state import OptimizerState, TorchRNG, Weights, fingerprint
from protege.runtime.updaters import even_forwards, make_updater



@dataclass
class Example:
    question_id: str
    question: str
    image: ImageSource  # the question's image(s), or its Row's `source` (files, decoded batch by batch)
    answer: str
    label: float  # 1 = student, 0 = teacher


def _batch(processor: StudentProcessor, examples: list[Example], images: list) -> dict[str, torch.Tensor]:
    return processor.encode_pairs([e.question for e in examples], images, [e.answer for e in examples])


@torch.no_grad()
def evaluate(disc: Discriminator, processor: StudentProcessor, examples: list[Example], batch_size: int,
             device: torch.device = torch.device("cpu"), workers: int = 0) -> dict:
    disc.eval()
    scores = []
    sources = [e.image for e in examples]
    for idx, images in decoded_batches(sources, consecutive(len(examples), batch_size), workers):
        batch = _batch(processor, [examples[i] for i in idx], images)
        scores += torch.sigmoid(disc(**to_device(batch, device))).tolist()
    disc.train()
    labels = [e.label for e in examples]
    acc = sum((s >= 0.5) == (y == 1) for s, y in zip(scores, labels)) / max(1, len(labels))
    return {"accuracy": acc, "auroc": auroc(scores, labels)}


def split_by_question(examples: list[Example], holdout_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Held-out questions never appear in training, so accuracy measures generalisation."""
    ids = sorted({e.question_id for e in examples})
    random.Random(seed).shuffle(ids)
    held = set(ids[: max(1, int(len(ids) * holdout_fraction))])
    return [e for e in examples if e.question_id not in held], [e for e in examples if e.question_id in held]


def batch_plan(n_train: int, batch_size: int, rng: random.Random, steps: range, rank: int,
               world_size: int) -> Iterator[list[int]]:
    """This rank's examples of each step, drawn as the loop draws them but from a copy of its RNG, so the
    decoders can run ahead while the RNG a saved state records stays at the loop's step."""
    ahead = random.Random()
    ahead.setstate(rng.getstate())  # now: the generator below starts only when the decoders ask
    return (ahead.sample(range(n_train), batch_size)[rank::world_size] for _ in steps)


def pretrain_discriminator(disc: Discriminator, processor: StudentProcessor, examples: list[Example],
                           cfg: DiscPretrainConfig, seed: int,
                           on_log: Callable[[int, dict], None] | None = None, *, state_dir=None,
                           inputs_digest: str = "", stop_after: int | None = None,
                           save_final: Callable[[Discriminator], None] | None = None, workers: int = 0) -> dict:
    """Trains `disc` in place, then scores the held-out questions. `state_dir`, `inputs_digest`,
    `stop_after`, `save_final` and `workers` work as in train_sft."""
    rank, world_size = world()
    train, held = split_by_question(examples, cfg.holdout_fraction, seed)
    batch_size = min(cfg.batch_size, len(train))
    if batch_size < world_size:
        raise UserFacingError(f"disc_pretrain.batch_size ({batch_size}, capped at {len(train)} training answers) "
                              f"must be at least the number of processes ({world_size})")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    device = resolve_device(cfg.device, "disc_pretrain.device")
    disc.to(device)
    # torch AdamW's default weight decay and no clipping: the settings the demo's discriminator was tuned with
    updater = make_updater(cfg.backend, disc, disc.trainable_parameters(), cfg.lr, cfg.zero_stage, device,
                           key="disc_pretrain.backend", weight_decay=0.01, clip=0.0)
    disc.train()
    tokens = budget_tokens(cfg.micro_batch_tokens, disc, device)
    parts = {"discriminator": Weights(updater), "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    run = Run(state_dir, parts, rng, fingerprint(result_params(cfg), seed, inputs_digest), cfg.steps, rank=rank,
              world_size=world_size, barrier=barrier)
    start, _ = run.resume()
    log_every = max(1, cfg.steps // 10)
    t0 = time.perf_counter()
    plan = batch_plan(len(train), batch_size, rng, range(start, cfg.steps + 1), rank, world_size)
    sources = [e.image for e in train]
    with contextlib.closing(decoded_batches(sources, plan, workers)) as batches:
        for step in range(start, cfg.steps + 1):
            picked = rng.sample(range(len(train)), batch_size)  # every rank draws the same batch ...
            mine_idx = picked[rank::world_size]                  # ... and trains on its slice
            planned, images = next(batches)
            if planned != mine_idx:  # the plan repeats the loop's draws: a difference is a bug, never data
                raise RuntimeError(f"disc_pretrain step {step}: decoded examples {planned} but the step drew "
                                   f"{mine_idx}")
            mine = [train[i] for i in mine_idx]
            whole = _batch(processor, mine, images)  # right-padded: a row's length is its attended tokens
            target = torch.tensor([e.label for e in mine], device=device)
            # each micro-batch's summed BCE as its share of the global batch's mean (distributed.global_mean_share);
            # answers of like length together, each micro-batch cut to its longest
            loss, logits = torch.zeros((), device=device), torch.zeros(len(mine), device=device)
            groups = rank_length_groups(whole["attention_mask"].sum(dim=1).tolist(), tokens, even_forwards(updater))
            for rows in map(sorted, groups):
                part = whole if len(rows) == len(mine) else processor.select_rows(whole, images, rows)
                out = disc(**to_device(processor.trimmed(part), device))
                share = F.binary_cross_entropy_with_logits(out, target[rows], reduction="sum") * (world_size / batch_size)
                updater.backward(share)
                loss += share.detach()
                logits[rows] = out.detach().float()
            step_loss = float(all_reduce_sum(loss) / world_size)
            if not math.isfinite(step_loss):
                raise FloatingPointError(f"discriminator loss is {step_loss} at step {step}; lower disc_pretrain.lr")
            updater.step()
            if due(step, log_every, cfg.steps):  # every rank: the sum is collective
                right = all_reduce_sum(((logits.detach() >= 0) == (target == 1)).float().sum())
                if on_log:
                    on_log(step, {"loss": step_loss, "train_batch_accuracy": float(right) / batch_size})
            if due(step, cfg.save_every, cfg.steps):
                run.save(step, {})
            if stop_after is not None and step >= stop_after:
                return {"steps": step, "seconds": time.perf_counter() - t0, "resumed_after_step": start - 1}
    with updater.gathered():  # collective under ZeRO-3; every rank scores the same held-out answers
        metrics = evaluate(disc, processor, held, cfg.batch_size, device, workers)
        if save_final is not None and rank == 0:
            save_final(disc)
    barrier()
    return {"heldout_accuracy": metrics["accuracy"], "heldout_auroc": metrics["auroc"],
            "train_examples": len(train), "heldout_examples": len(held), "resumed_after_step": start - 1}
