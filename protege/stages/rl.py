"""rl: the RL loop from the SFT checkpoint (pi_init = pi_ref), writing a checkpoint every k steps.

The full training state is kept in models/rl/state; a run killed at any step and started again with the
same params resumes from the last state and ends with the same weights. A state from other params is
discarded with the checkpoints beside it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from protege.config import Config
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.student import load_student
from protege.paths import (
    CURATED_RL,
    DISCRIMINATOR,
    RL_CHECKPOINTS,
    SFT_MODEL,
    TEACHER_ANSWERS,
)
from protege.rewards.llm_judge import LLMJudge
from protege.rl.checkpoint import read_state
from protege.rl.loop import RLInputs, fingerprint, run_rl
from protege.stages.common import say, step_logger, write_stage_metrics
from protege.teachers.factory import build_teacher

STATE = "state"


def prepare_out_dir(out: Path, fp: str) -> int:
    """Keeps a resumable run's folder (returns its step), or empties it for a fresh run (returns 0)."""
    meta = read_state(out / STATE) if out.exists() else None
    if meta is None or meta["fingerprint"] != fp:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        return 0
    for ckpt in out.glob("step-*"):  # written after the last state save: will be written again
        if int(ckpt.name.split("-")[1]) > meta["step"]:
            shutil.rmtree(ckpt)
    return meta["step"]


def teacher_answers(root: Path) -> dict[str, list[tuple[str, str]]]:
    path = root / TEACHER_ANSWERS
    if not path.exists():
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    df = pd.read_parquet(path)
    for qid, teacher, text in zip(df["question_id"], df["teacher"], df["answer"]):
        out.setdefault(qid, []).append((teacher, text))
    return out


def run(cfg: Config, root: Path, run) -> None:
    c = cfg.rl
    run.log_params(c.model_dump(), "rl.")
    for rel, ctx in ((CURATED_RL, "questions"), (SFT_MODEL, "init"), (TEACHER_ANSWERS, "teacher_answers"),
                     (DISCRIMINATOR, "discriminator")):
        if (root / rel).exists():
            run.log_input(rel, context=ctx)
    policy, processor = load_student(root / SFT_MODEL)
    ref, _ = load_student(root / SFT_MODEL)
    out = root / RL_CHECKPOINTS
    resumed = prepare_out_dir(out, fingerprint(c, cfg.seed))
    judge = None
    if c.judge == "llm":
        judge = LLMJudge(build_teacher(c.judge_model, root, 0.0, cfg.seed), out / "judge_verdicts.jsonl")
    inputs = RLInputs(load_rows(root / CURATED_RL), teacher_answers(root),
                      Discriminator.load(root / DISCRIMINATOR) if c.algorithm == "ril" else None, judge)
    say("rl", f"{c.algorithm}: {c.steps} steps x {c.questions_per_step} questions x {c.group_size} samples"
              + (f" + {c.group_size} teacher answers" if c.algorithm == "ril" and c.teacher_in_group else "")
              + f", trainable={c.trainable}" + (f"; resuming after step {resumed}" if resumed else ""))
    history: list[dict] = []
    log_step = step_logger("rl", run, every_print=max(1, c.steps // 10))

    def log(step: int, metrics: dict) -> None:
        history.append(metrics)
        log_step(step, metrics)

    saved = run_rl(policy, ref, processor, inputs, c, out, cfg.seed, on_log=log, state_dir=out / STATE)
    run.log_model(saved[-1], "rl-final", params=c.model_dump())
    summary = {"checkpoints": len(saved), "resumed_after_step": resumed}
    if history:
        k = max(1, len(history) // 4)
        for key in ("reward", "answer_reward_student", "similarity_reward_student", "disc_accuracy"):
            if key in history[0]:
                summary[f"{key}_first_quarter"] = sum(h[key] for h in history[:k]) / k
                summary[f"{key}_last_quarter"] = sum(h[key] for h in history[-k:]) / k
    write_stage_metrics(root, "rl", summary)
    say("rl", " ".join(f"{k}={v:.3f}" for k, v in summary.items() if isinstance(v, float))
        + f"; {len(saved)} checkpoints -> {RL_CHECKPOINTS}")
