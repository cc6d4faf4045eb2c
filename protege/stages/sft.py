"""sft: supervised warm-up of the student on the train split plus the retraining pool; the result is
pi_init and pi_ref. It starts from `sft.init` (the base student, or the registry's champion when retraining).

The training state is saved to models/.state/sft every sft.save_every steps; a run killed and started again
with the same params and inputs resumes there and ends with the same weights. Several processes under
torchrun (sft.backend deepspeed) each train on a slice of every batch; rank 0 alone records and writes."""
from __future__ import annotations

import shutil
from pathlib import Path

from protege.config import Config, tracked_params
from protege.data.loader import workers_of_rank
from protege.data.rows import load_rows
from protege.models.student import save_student
from protege.paths import SFT_MODEL, TRAINING_STATES, split_table
from protege.pool import pool_tables
from protege.stages.common import QuietRun, inputs_digest, say, step_logger, write_stage_metrics
from protege.stages.student_model import init_dir, load_model, log_start_model, model_path, with_lora
from protege.runtime.distributed import world
from protege.runtime.placement import resolve_device
from protege.train.sft import train_sft


def run(cfg: Config, root: Path, run) -> None:
    lead = world()[0] == 0
    if not lead:
        run = QuietRun()
    run.log_params(tracked_params(cfg.sft), "sft.")
    train = split_table(cfg.data.source, "train")
    run.log_input(train, context="train")
    start = init_dir(cfg, root)
    log_start_model(cfg, root, run, start, "init")
    model, processor = load_model(cfg, start, resolve_device(cfg.sft.device, "sft.device"))
    model = with_lora(cfg, model, cfg.sft.trainable)
    rows = load_rows(root / train)
    processor.check_images(rows, str(train))
    pooled = pool_tables(root)
    for table in pooled:
        run.log_input(table.relative_to(root), context="pool")
        more = load_rows(table)
        processor.check_images(more, str(table.relative_to(root)))
        rows += more
    if lead:
        origin = cfg.model.path if model_path(cfg, root) == start else cfg.sft.init
        say("sft", f"{len(rows)} examples ({len(pooled)} pool batches), from {origin}, "
                   f"{cfg.sft.steps} steps of {cfg.sft.batch_size}")
    state = root / TRAINING_STATES / "sft"
    outside = model_path(cfg, root) == start
    digest = inputs_digest(root, [train, *([] if outside else [cfg.sft.init]),
                                  *(t.relative_to(root) for t in pooled)], [cfg.model.digest] if outside else [])
    result = train_sft(model, processor, rows, cfg.sft, cfg.seed, on_log=step_logger("sft", run) if lead else None,
                       state_dir=state, inputs_digest=digest,
                       save_final=lambda m: save_student(m, processor, root / SFT_MODEL),
                       workers=workers_of_rank(cfg.data.workers))
    if not lead:
        return
    shutil.rmtree(state, ignore_errors=True)  # the checkpoint is written: a finished run needs no state
    run.log_model(root / SFT_MODEL, "sft", params=cfg.sft.model_dump())
    write_stage_metrics(root, "sft", result)
    resumed = f", resumed after step {result['resumed_after_step']}" if result["resumed_after_step"] else ""
    say("sft", f"done in {result['seconds']:.1f} s{resumed} -> {SFT_MODEL}")
