"""world: the embedded world's data (train / rl / test) and the base student it starts from.

With real data this stage is replaced by importing your files; with `model.path` set, the stages start from
that folder and the tiny student written here is not used.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from protege.config import Config, tracked_params
from protege.errors import UserFacingError
from protege.models.processor import StudentProcessor
from protege.models.student import build_student, save_student
from protege.models.tokenizer import train_tokenizer
from protege.paths import BASE_MODEL, WORLD
from protege.pool import ensure_pool
from protege.stages.common import say, write_stage_metrics
from protege.world.generate import generate_world, vocabulary_texts


def run(cfg: Config, root: Path, run) -> None:
    if cfg.data.source != "world":
        raise UserFacingError(f"data.source is {cfg.data.source!r} but dvc.yaml still runs the world stage: run "
                              "`protege dag` to write dvc.yaml for your files (`protege pipeline` does it itself)")
    run.log_params(tracked_params(cfg.world), "world.")
    run.log_params(tracked_params(cfg.model), "model.")
    out = root / WORLD
    if out.exists():
        shutil.rmtree(out)
    frames = generate_world(cfg.world, out)
    ensure_pool(root)  # sft lists the retraining pool as a dependency, so it exists from the start (empty)
    say("world", ", ".join(f"{k}: {len(v)} rows" for k, v in frames.items()) + f" -> {WORLD}")

    # the tokenizer learns the world's text (questions, answers, SFT targets, teacher phrasings) and nothing else
    tokenizer = train_tokenizer(vocabulary_texts(frames["train"]), cfg.world.vocab_size)
    # the processor's files go straight into the student's folder: an ordinary Hugging Face folder
    processor = StudentProcessor.create(tokenizer, cfg.world.image_size, cfg.model.patch_size, cfg.model.merge_size,
                                        folder=root / BASE_MODEL)
    model = build_student(cfg.model, processor, cfg.seed)
    save_student(model, processor, root / BASE_MODEL)
    n_params = sum(p.numel() for p in model.parameters())
    say("world", f"base student: {n_params:,} parameters, vocabulary {len(tokenizer)} -> {BASE_MODEL}")
    metrics = {**{f"rows_{k}": len(v) for k, v in frames.items()}, "student_parameters": n_params,
               "vocab_size": len(tokenizer)}
    run.log_metrics(metrics)
    write_stage_metrics(root, "world", metrics)
