"""disc_pretrain: the discriminator learns to tell student answers (1) from teacher answers (0).

Like sft it saves its training state (models/.state/disc_pretrain) for exact resume after a kill, and runs
as several processes under torchrun with disc_pretrain.backend deepspeed; rank 0 alone records and writes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from protege.config import Config, discriminator_trainable, tracked_params
from protege.data.loader import workers_of_rank
from protege.data.rows import load_rows, read_parquet_table
from protege.models.discriminator import Discriminator, load_discriminator
from protege.models.processor import StudentProcessor
from protege.paths import (
    CURATED_RL,
    DISCRIMINATOR,
    ROLLOUTS,
    SFT_MODEL,
    TEACHER_ANSWERS,
    TRAINING_STATES,
)
from protege.stages.common import QuietRun, inputs_digest, say, step_logger, write_stage_metrics
from protege.train.disc_pretrain import Example, pretrain_discriminator
from protege.runtime.distributed import world


def balanced_teacher_answers(teacher: pd.DataFrame, student: pd.DataFrame, seed: int) -> pd.DataFrame:
    """As many teacher answers per question as student answers (RIL: N and N), drawn across teachers."""
    want = student.groupby("question_id").size()
    teacher = teacher[teacher["question_id"].isin(want.index)]
    picked = [g.sample(n=min(len(g), int(want[qid])), random_state=seed) for qid, g in teacher.groupby("question_id")]
    return pd.concat(picked, ignore_index=True) if picked else teacher.iloc[:0]


def run(cfg: Config, root: Path, run) -> None:
    lead = world()[0] == 0
    if not lead:
        run = QuietRun()
    run.log_params(tracked_params(cfg.disc_pretrain), "disc_pretrain.")
    for rel, ctx in ((ROLLOUTS, "student_answers"), (TEACHER_ANSWERS, "teacher_answers"), (SFT_MODEL, "init")):
        run.log_input(rel, context=ctx)
    rows = {r.id: r for r in load_rows(root / CURATED_RL)}
    student = read_parquet_table(root / ROLLOUTS, ("question_id", "answer"), "student rollouts")
    student = student[student["question_id"].isin(rows)]
    teacher = balanced_teacher_answers(read_parquet_table(root / TEACHER_ANSWERS, ("question_id", "teacher", "answer"),
                                                          "teacher answers"), student, cfg.seed)
    examples = [Example(qid, rows[qid].question, rows[qid].source, ans, label)  # images decoded batch by batch
                for frame, label in ((student, 1.0), (teacher, 0.0))
                for qid, ans in zip(frame["question_id"], frame["answer"])]
    if lead:
        say("disc_pretrain", f"{len(student)} student + {len(teacher)} teacher answers "
                             f"({teacher['teacher'].value_counts().to_dict()})")
    disc = load_discriminator(root / SFT_MODEL, from_student=True, trust_remote_code=cfg.model.trust_remote_code,
                              dtype=cfg.model.dtype, recompute=cfg.model.gradient_checkpointing,
                              lora=cfg.model.lora if discriminator_trainable(cfg.disc_pretrain.trainable, cfg.model) == "lora" else None)
    processor = StudentProcessor.from_pretrained(root / SFT_MODEL, cfg.model.trust_remote_code)

    def save(trained: Discriminator) -> None:
        trained.save(root / DISCRIMINATOR)
        processor.save_pretrained(root / DISCRIMINATOR)

    state = root / TRAINING_STATES / "disc_pretrain"
    result = pretrain_discriminator(disc, processor, examples, cfg.disc_pretrain, cfg.seed,
                                    on_log=step_logger("disc_pretrain", run) if lead else None, state_dir=state,
                                    inputs_digest=inputs_digest(root, [CURATED_RL, ROLLOUTS, TEACHER_ANSWERS,
                                                                       SFT_MODEL]), save_final=save,
                                    workers=workers_of_rank(cfg.data.workers))
    if not lead:
        return
    shutil.rmtree(state, ignore_errors=True)  # the discriminator is written: a finished run needs no state
    run.log_metrics(result)
    run.log_model(root / DISCRIMINATOR, "discriminator", params=cfg.disc_pretrain.model_dump())
    write_stage_metrics(root, "disc_pretrain", result)
    say("disc_pretrain", f"held-out accuracy {result['heldout_accuracy']:.3f}, AUROC {result['heldout_auroc']:.3f}")
