"""Supervised warm-up: cross-entropy on answer tokens only, on the shared training runtime.

One process (sft.backend torch or deepspeed), or several under torchrun / the deepspeed launcher
(sft.backend deepspeed): every process draws the same global batch of sft.batch_size rows, in the order
one process would, and trains on its slice of it. The loss is the mean over all answer tokens of the
global batch (distributed.global_mean_share), so N processes take the steps one process takes, up to the
order of float sums. With a state folder the run saves its training state every sft.save_every steps and
a re-run resumes from it, ending with bitwise the weights of an uninterrupted run (CPU, fp32).
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator

import torch

from protege.config import SFTConfig, result_params
from protege.data.loader import decoded_batches, row_sources
from protege.data.rows import Row
from protege.errors import UserFacingError
from protege.models.processor import StudentProcessor
from protege.rollout.trajectory import Trajectory, answer_trajectory, score
from protege.runtime.distributed import all_reduce_sum, barrier, world
from protege.runtime.micro import budget_tokens, rank_length_groups
from protege.runtime.placement import resolve_device
from protege.runtime.run import Run, due, next_rows
from protege.runtime.schedule import lr_factor
from protege.runtime.state import OptimizerState, TorchRNG, Weights, fingerprint
from protege.runtime.updaters import even_forwards, make_updater

# settings that change when things are logged or saved, never the weights: a state survives changing them


def answer_nll(model, traj: Trajectory) -> torch.Tensor:
    """Summed token cross-entropy over the answer tokens of `traj` (answer_trajectory). -> scalar."""
    return -(score(model, traj).logp * traj.loss_mask).sum()


def answer_loss(model, batch: dict[str, torch.Tensor], images: list | None = None) -> torch.Tensor:
    """Mean token cross-entropy over answer tokens (prompt and padding masked), in one forward."""
    traj = answer_trajectory(batch, images)
    return answer_nll(model, traj) / max(answer_tokens(batch), 1)


def answer_tokens(batch: dict[str, torch.Tensor]) -> int:
    """How many tokens answer_loss averages over: answer tokens that some earlier position predicts."""
    return int(batch["answer_mask"][:, 1:].sum())


def batch_plan(order: list[int], n_rows: int, cfg: SFTConfig, rng: random.Random, start: int, rank: int,
               world_size: int) -> Iterator[list[int]]:
    """This rank's rows of every step from `start` on, drawn as the loop draws them but from a copy of its RNG:
    the decoders run ahead of the loop while the RNG a saved state records stays at the loop's step."""
    ahead = random.Random()
    ahead.setstate(rng.getstate())  # now: the generator below starts only when the decoders ask

    def draws(order: list[int]) -> Iterator[list[int]]:
        for _ in range(start, cfg.steps + 1):
            idx, order = next_rows(order, n_rows, cfg.batch_size, ahead)
            yield idx[rank::world_size]
    return draws(list(order))


def train_sft(model, processor: StudentProcessor, rows: list[Row], cfg: SFTConfig, seed: int,
              on_log: Callable[[int, dict], None] | None = None, *, state_dir=None, inputs_digest: str = "",
              stop_after: int | None = None, save_final: Callable[[torch.nn.Module], None] | None = None,
              workers: int = 0) -> dict:
    """Trains `model` in place. With `state_dir`, resumes from a state of this very run found there
    (same settings, seed, processes and `inputs_digest`) and saves one every `save_every` steps.
    `save_final(model)` runs on rank 0 with whole weights (ZeRO-3 gathers them) once training is done;
    `stop_after` ends the run after that step's state save without it, as a kill would (tests).
    `workers`: processes decoding the next batches' images ahead of the step (protege.data.loader)."""
    rank, world_size = world()
    if cfg.batch_size < world_size:
        raise UserFacingError(f"sft.batch_size ({cfg.batch_size}) must be at least the number of processes "
                              f"({world_size}): each process trains on a slice of every batch")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    device = resolve_device(cfg.device, "sft.device")
    model.to(device)
    updater = make_updater(cfg.backend, model, [p for p in model.parameters() if p.requires_grad], cfg.lr, cfg.zero_stage, device,
                           key="sft.backend", weight_decay=cfg.weight_decay, lr_lambda=lambda i: lr_factor(i, cfg))
    model.train()
    tokens = budget_tokens(cfg.micro_batch_tokens, model, device)
    parts = {"model": Weights(updater), "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    run = Run(state_dir, parts, rng, fingerprint(result_params(cfg), seed, inputs_digest), cfg.steps, rank=rank,
              world_size=world_size, barrier=barrier)
    start, cursor = run.resume()
    order: list[int] = cursor.get("order", [])
    running: list[float] = cursor.get("running", [])  # losses since the last log line: a resumed run logs the same
    t0 = time.perf_counter()
    plan = batch_plan(order, len(rows), cfg, rng, start, rank, world_size)
    with contextlib.closing(decoded_batches(row_sources(rows), plan, workers)) as batches:
        for step in range(start, cfg.steps + 1):
            idx, order = next_rows(order, len(rows), cfg.batch_size, rng)
            mine = idx[rank::world_size]  # every rank drew the same global batch
            planned, decoded = next(batches)
            if planned != mine:  # the plan repeats the loop's draws: a difference is a bug, never data
                raise RuntimeError(f"sft step {step}: decoded rows {planned} but the step drew {mine}")
            images = processor.image_lists(decoded)
            batch = processor.encode_pairs([rows[i].question for i in mine], images,
                                           [rows[i].sft_target for i in mine])
            local = answer_tokens(batch)
            total = int(all_reduce_sum(torch.tensor(local, device=device))) if world_size > 1 else local
            traj = answer_trajectory(batch, images)
            # each micro-batch's summed loss as its share of the global batch's token mean (global_mean_share)
            loss = torch.zeros((), device=device)
            for rows_ in rank_length_groups(traj.inputs["attention_mask"].sum(dim=1).tolist(), tokens,
                                             even_forwards(updater)):
                part = (traj if len(rows_) == traj.n else traj.select(rows_, processor)).trimmed(processor).to(device)
                share = answer_nll(model, part) * (world_size / total)
                updater.backward(share)
                loss += share.detach()
            step_loss = float(all_reduce_sum(loss) / world_size)  # the global batch's mean: the same on every rank
            if not math.isfinite(step_loss):
                raise FloatingPointError(f"SFT loss is {step_loss} at step {step}; lower sft.lr")
            grad_norm = updater.step()
            running.append(step_loss)
            if due(step, cfg.log_every, cfg.steps):
                if on_log:
                    on_log(step, {"loss": sum(running) / len(running), "grad_norm": grad_norm,
                                  "seconds_per_step": (time.perf_counter() - t0) / (step - start + 1)})
                running = []
            if due(step, cfg.save_every, cfg.steps):
                run.save(step, {"order": order, "running": running})
            if stop_after is not None and step >= stop_after:
                return {"steps": step, "seconds": time.perf_counter() - t0, "resumed_after_step": start - 1}
    if save_final is not None:
        with updater.gathered():  # collective under ZeRO-3
            if rank == 0:
                save_final(model)
        barrier()  # the checkpoint exists for every rank once this returns
    return {"steps": cfg.steps, "seconds": time.perf_counter() - t0, "resumed_after_step": start - 1}
