"""rl: the RL loop from the SFT checkpoint (pi_init = pi_ref), writing a checkpoint every k steps.

The full training state is kept in models/rl/state; a run killed at any step and started again with the
same params resumes from the last state and ends with the same weights. A state from other params is
discarded with the checkpoints beside it. The learning curve (greedy accuracy on the world's val split
every rl.eval_every steps) goes to MLflow and to reports/rl/learning_curve.csv (DVC plots), every step's
logged figures to reports/rl/train_curve.csv.
`train` is the whole recipe; the rl_baseline stage runs it with another algorithm into its own folders.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
import torch

from protege.config import Config, discriminator_trainable, tracked_params
from protege.data.rows import Row, load_rows, read_parquet_table
from protege.eval.accuracy import evaluate_rows
from protege.models.discriminator import load_discriminator
from protege.paths import (
    CURATED_RL,
    DISCRIMINATOR,
    RL_CHECKPOINTS,
    SFT_MODEL,
    split_table,
    TEACHER_ANSWERS,
)
from protege.rewards.functions import load_rewards
from protege.rewards.llm_judge import LLMJudge
from protege.rl.loop import RLInputs, fingerprint, run_rl
from protege.stages.common import QuietRun, StepHistory, inputs_digest, say, step_logger, write_stage_metrics
from protege.stages.student_model import load_model, with_lora
from protege.teachers.factory import build_teacher
from protege.runtime.distributed import all_reduce_sum, on_rank0, world
from protege.runtime.placement import CPU, resolve_device
from protege.runtime.run_folder import drop_previous, prepare_out_dir

STATE = "state"
CURVE = Path("reports/rl/learning_curve.csv")  # DVC plots: step, accuracy, one column per question kind


def train_curve(curve_rel: Path) -> Path:
    """Beside the learning curve: every step's logged figures (reward, similarity reward, discriminator)."""
    return curve_rel.with_name("train_curve.csv")


def input_files(root: Path, val: Path, ril: bool) -> list[Path]:
    """The files an RL run starts from: SFT weights, curated questions, the val split of its learning curve
    (when there is one), and for RIL the teacher answers and discriminator."""
    return [SFT_MODEL, CURATED_RL, *([val] if (root / val).exists() else []),
            *([TEACHER_ANSWERS, DISCRIMINATOR] if ril else [])]


def teacher_answers(root: Path) -> dict[str, list[tuple[str, str]]]:
    path = root / TEACHER_ANSWERS
    if not path.exists():
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    df = read_parquet_table(path, ("question_id", "teacher", "answer"), "teacher answers")
    for qid, teacher, text in zip(df["question_id"], df["teacher"], df["answer"]):
        out.setdefault(qid, []).append((teacher, text))
    return out


class LearningCurve:
    """Greedy accuracy of the policy on held-out rows at some steps: MLflow metrics `val_accuracy` and
    `val_accuracy.<kind>`, and a CSV (step, accuracy, one column per kind) rewritten at every point.

    A resumed run keeps the points up to the step it resumes after and evaluates the rest again. Under several
    processes each rank answers its share of the rows (every `world_size`-th) and the counts are summed, so
    the point costs 1 / world_size of the rows' time on each rank; rank 0 writes and logs it.
    """

    def __init__(self, path: Path, rows: list[Row], processor, batch_size: int, max_new_tokens: int, run=None,
                 resumed_after: int = 0):
        self.path, self.rows, self.processor, self.run = path, rows, processor, run
        self.batch_size, self.max_new_tokens = batch_size, max_new_tokens
        self.kinds = sorted({r.kind for r in rows if r.kind})
        self.columns = ["step", "accuracy", *self.kinds]
        self.points: list[dict] = []
        if resumed_after and path.exists():
            old = pd.read_csv(path)
            if list(old.columns) == self.columns:  # (other columns cannot belong to a resumed state)
                self.points = old[old["step"] <= resumed_after].to_dict("records")
        if world()[0] == 0:  # under DeepSpeed the evaluating process owns the file
            self._write()

    def __call__(self, step: int, policy) -> None:
        rank, size = world()
        mine = self.rows[rank::size]
        items = evaluate_rows(policy, self.processor, mine, self.batch_size, self.max_new_tokens)[1] if mine else []
        # (right, answered): over all rows, then each kind's; summed over ranks (a collective)
        counts = torch.zeros(1 + len(self.kinds), 2, dtype=torch.float64)
        for item in items:
            answer = torch.tensor([float(item["correct"]), 1.0], dtype=torch.float64)
            counts[0] += answer
            if item["kind"] in self.kinds:
                counts[1 + self.kinds.index(item["kind"])] += answer
        counts = all_reduce_sum(counts).tolist()
        if rank != 0:
            return
        share = [right / answered if answered else math.nan for right, answered in counts]
        point = {"step": step, "accuracy": 0.0 if not counts[0][1] else share[0],
                 **{k: share[1 + i] for i, k in enumerate(self.kinds)}}
        self.points = [p for p in self.points if p["step"] < step] + [point]
        self._write()
        if self.run is not None:
            self.run.log_metrics({"val_accuracy": point["accuracy"],
                                  **{f"val_accuracy.{k}": point[k] for k in self.kinds}}, step=step)

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        pd.DataFrame(self.points, columns=self.columns).to_csv(tmp, index=False)
        tmp.replace(self.path)


def empty_curve(path: Path) -> None:
    """The curve's CSV with no point (no val split, or rl.eval_every 0): DVC expects the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("step,accuracy\n")


def learning_curve(cfg: Config, root: Path, run, processor, path: Path, resumed_after: int,
                   stage: str) -> LearningCurve | None:
    c = cfg.rl
    val_rel = split_table(cfg.data.source, "val")
    val = root / val_rel
    if c.eval_every == 0 or not val.exists():
        if world()[0] == 0:
            empty_curve(root / path)
        say(stage, "no learning curve: " + ("rl.eval_every is 0" if c.eval_every == 0 else
                                            f"{val_rel} is absent (data.val is null)"))
        return None
    rows = load_rows(val)[:c.eval_items]
    run.log_input(val_rel, context="learning_curve")
    say(stage, f"learning curve: greedy accuracy on {len(rows)} val questions every {c.eval_every} steps -> {path}")
    return LearningCurve(root / path, rows, processor, cfg.evaluate.batch_size, c.max_new_tokens, run, resumed_after)


def train(cfg: Config, root: Path, run, algorithm: str, out_rel: Path, curve_rel: Path, stage: str,
          model_name: str) -> dict:
    """The RL run of `cfg.rl` with `algorithm`, from the SFT checkpoint into `out_rel` (checkpoints + resume
    state), its learning curve into `curve_rel`; logs to `run`, writes reports/stages/<stage>.json and
    returns that summary. Under several processes rank 0 alone prepares the folder, records and writes."""
    t0 = time.perf_counter()
    lead = world()[0] == 0
    if not lead:
        run = QuietRun()
    c = cfg.rl.model_copy(update={"algorithm": algorithm})
    run.log_params(tracked_params(c), "rl.")
    ril = algorithm == "ril"
    for rel, ctx in ((CURATED_RL, "questions"), (SFT_MODEL, "init"), (TEACHER_ANSWERS, "teacher_answers"),
                     (DISCRIMINATOR, "discriminator")):
        if (root / rel).exists() and (ril or rel not in (TEACHER_ANSWERS, DISCRIMINATOR)):
            run.log_input(rel, context=ctx)
    # a reward function that cannot be imported fails before any model loads; the project folder goes on
    # sys.path for its modules whatever launched the stage
    load_rewards(c.rewards, root)
    device = resolve_device(c.device, "rl.device")
    idle = CPU if c.offload_idle and c.backend == "torch" else device  # where the reference and discriminator wait
    policy, processor = load_model(cfg, root / SFT_MODEL, device)
    # a LoRA policy is its own reference (adapters disabled): no second copy; no KL term: no reference at all
    ref = None if c.trainable == "lora" or c.kl_beta == 0 else load_model(cfg, root / SFT_MODEL, idle)[0]
    policy = with_lora(cfg, policy, c.trainable)
    out = root / out_rel
    digest = inputs_digest(root, input_files(root, split_table(cfg.data.source, "val"), ril))
    resumed = on_rank0(lambda: prepare_out_dir(out, fingerprint(c, cfg.seed, digest), c.steps))
    judge = None
    if c.judge == "llm":
        judge = LLMJudge(build_teacher(c.judge_model, root, 0.0, cfg.seed), out / "judge_verdicts.jsonl")
    # every rank holds the curve and answers its share of the rows (under ZeRO-3 the gather is a collective)
    curve = learning_curve(cfg, root, run, processor, curve_rel, resumed, stage)
    rows = load_rows(root / CURATED_RL)
    processor.check_images(rows, str(CURATED_RL))
    disc_lora = cfg.model.lora if discriminator_trainable(c.disc_trainable, cfg.model) == "lora" else None
    disc = (load_discriminator(root / DISCRIMINATOR, trust_remote_code=cfg.model.trust_remote_code,
                               dtype=cfg.model.dtype, recompute=cfg.model.gradient_checkpointing, lora=disc_lora,
                               device=idle)
            if ril else None)
    inputs = RLInputs(rows, teacher_answers(root) if ril else {}, disc, judge, evaluator=curve,
                      max_prompt_tokens=cfg.curate.max_tokens)  # curate dropped every longer question
    say(stage, f"{algorithm}: {c.steps} steps x {c.questions_per_step} questions x {c.group_size} samples"
               + (f" + {c.group_size} teacher answers" if ril and c.teacher_in_group else "")
               + f", trainable={c.trainable}" + (f"; resuming after step {resumed}" if resumed else ""))
    steps = StepHistory(root / train_curve(curve_rel) if lead else None, resumed)  # kept across a resume
    log_step = step_logger(stage, run, every_print=max(1, c.steps // 10))

    def log(step: int, metrics: dict) -> None:
        steps.add(step, metrics)
        log_step(step, metrics)

    saved = run_rl(policy, ref, processor, inputs, c, out, cfg.seed, on_log=log if lead else None,
                   state_dir=out / STATE, inputs_digest=digest,
                   on_state_saved=lambda step: drop_previous(out) if lead else None)
    if not lead:
        return {}
    drop_previous(out)
    run.log_model(saved[-1], model_name, params=tracked_params(c))
    # seconds: what a study scales its expected time from (protege/study/estimate.py)
    summary = {"algorithm": algorithm, "checkpoints": len(saved), "resumed_after_step": resumed,
               "processes": world()[1], "seconds": time.perf_counter() - t0}
    history = steps.rows
    if history:  # the first and last quarter of the run's steps
        k = max(1, len(history) // 4)
        for key in ("reward", "answer_reward_student", "similarity_reward_student", "disc_accuracy", "disc_auroc"):
            if all(key in h for h in history):
                summary[f"{key}_first_quarter"] = sum(h[key] for h in history[:k]) / k
                summary[f"{key}_last_quarter"] = sum(h[key] for h in history[-k:]) / k
    if curve is not None and curve.points:
        summary["val_accuracy_first"] = float(curve.points[0]["accuracy"])
        summary["val_accuracy_last"] = float(curve.points[-1]["accuracy"])
    write_stage_metrics(root, stage, summary)
    say(stage, " ".join(f"{k}={v:.3f}" for k, v in summary.items() if isinstance(v, float))
        + f"; {len(saved)} checkpoints -> {out_rel}")
    return summary


def run(cfg: Config, root: Path, run) -> None:
    train(cfg, root, run, cfg.rl.algorithm, RL_CHECKPOINTS, CURVE, "rl", "rl-final")
