"""sft: supervised warm-up of the base student on the train split; the result is pi_init and pi_ref."""
from __future__ import annotations

from pathlib import Path

from protege.config import Config
from protege.data.rows import load_rows
from protege.models.student import load_student, save_student
from protege.paths import BASE_MODEL, SFT_MODEL, SPLIT_TABLES
from protege.stages.common import say, step_logger, write_stage_metrics
from protege.train.sft import train_sft


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.sft.model_dump(), "sft.")
    run.log_input(SPLIT_TABLES["train"], context="train")
    run.log_input(BASE_MODEL, context="base_model")
    model, processor = load_student(root / BASE_MODEL)
    rows = load_rows(root / SPLIT_TABLES["train"])
    say("sft", f"{len(rows)} examples, {cfg.sft.steps} steps of {cfg.sft.batch_size}")
    result = train_sft(model, processor, rows, cfg.sft, cfg.seed, on_log=step_logger("sft", run))
    save_student(model, processor, root / SFT_MODEL)
    run.log_model(root / SFT_MODEL, "sft", params=cfg.sft.model_dump())
    write_stage_metrics(root, "sft", result)
    say("sft", f"done in {result['seconds']:.1f} s -> {SFT_MODEL}")
