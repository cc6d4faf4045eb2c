"""rl: the RL loop from the SFT checkpoint (pi_init = pi_ref), writing a checkpoint every k steps."""
from __future__ import annotations

import shutil
from pathlib import Path

from protege.config import Config
from protege.data.rows import load_rows
from protege.models.student import load_student
from protege.paths import CURATED_RL, DISCRIMINATOR, RL_CHECKPOINTS, SFT_MODEL, TEACHER_ANSWERS
from protege.rl.loop import run_rl
from protege.stages.common import say, step_logger, write_stage_metrics


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.rl.model_dump(), "rl.")
    for rel, ctx in ((CURATED_RL, "questions"), (SFT_MODEL, "init"), (TEACHER_ANSWERS, "teacher_answers"),
                     (DISCRIMINATOR, "discriminator")):
        run.log_input(rel, context=ctx)
    policy, processor = load_student(root / SFT_MODEL)
    ref, _ = load_student(root / SFT_MODEL)
    rows = load_rows(root / CURATED_RL)
    out = root / RL_CHECKPOINTS
    if out.exists():
        shutil.rmtree(out)
    say("rl", f"{cfg.rl.algorithm}: {cfg.rl.steps} steps x {cfg.rl.questions_per_step} questions x "
              f"{cfg.rl.group_size} samples, trainable={cfg.rl.trainable}")
    history: list[dict] = []

    def log(step: int, metrics: dict) -> None:
        history.append(metrics)
        step_logger("rl", run, every_print=max(1, cfg.rl.steps // 10))(step, metrics)

    saved = run_rl(policy, ref, processor, rows, cfg.rl, out, cfg.seed, on_log=log)
    run.log_model(saved[-1], "rl-final", params=cfg.rl.model_dump())
    k = max(1, len(history) // 4)
    summary = {"checkpoints": len(saved),
               "reward_first_quarter": sum(h["reward"] for h in history[:k]) / k,
               "reward_last_quarter": sum(h["reward"] for h in history[-k:]) / k}
    write_stage_metrics(root, "rl", summary)
    say("rl", f"reward {summary['reward_first_quarter']:.3f} -> {summary['reward_last_quarter']:.3f}; "
              f"{len(saved)} checkpoints -> {RL_CHECKPOINTS}")
