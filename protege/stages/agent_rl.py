"""agent_rl: multi-turn RL on the agent game from the warm start, guided by GTR-Turbo's merged teacher
when agent.rl.gtr.guidance is sft or kl. Success rate on held-out layouts before and after (and of the
merged teacher), with bootstrap CIs, in reports/agent/summary.json; resumable like the rl stage."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from protege import tracking
from protege.config import Config
from protege.eval.agent import evaluate_agent
from protege.models.student import load_student
from protege.paths import AGENT_REPORT, AGENT_RL, AGENT_SFT_MODEL
from protege.rl.agent_loop import agent_fingerprint, run_agent_rl
from protege.stages.common import say, step_logger, write_stage_metrics
from protege.train.runtime.run_folder import drop_previous, prepare_out_dir

STATE = "state"
MERGED_TEACHER = "merged-teacher"


def _eval(name: str, model, processor, cfg: Config, run) -> dict:
    r = evaluate_agent(model, processor, cfg.agent, cfg.world.image_size, seed=cfg.seed)
    run.log_metrics({f"{name}.success_rate": r["success_rate"], f"{name}.entropy": r["entropy"],
                     f"{name}.format_error_rate": r["format_error_rate"]})
    say("agent_rl", f"{name}: success {100 * r['success_rate']:.1f}% [{100 * r['success_ci'][0]:.1f}, "
                    f"{100 * r['success_ci'][1]:.1f}] on {r['episodes']} held-out layouts, format errors "
                    f"{100 * r['format_error_rate']:.1f}% of turns, entropy {r['entropy']:.3f}")
    return r


def train(cfg: Config, root: Path, run) -> dict:
    """The whole recipe (the study runs it in its own folders): returns the summary with per-episode results."""
    a = cfg.agent
    run.log_params({**a.rl.model_dump(exclude={"gtr"}), **{f"gtr.{k}": v for k, v in a.rl.gtr.model_dump().items()}},
                   "agent.rl.")
    run.log_input(AGENT_SFT_MODEL, context="init")
    digest = tracking.dvc_digest(root, AGENT_SFT_MODEL) or tracking.stat_digest(root / AGENT_SFT_MODEL)
    digest = hashlib.sha256(json.dumps(digest).encode()).hexdigest()[:16]
    out = root / AGENT_RL
    resumed = prepare_out_dir(out, agent_fingerprint(a, cfg.seed, digest), a.rl.steps)
    policy, processor = load_student(root / AGENT_SFT_MODEL)
    start = _eval("start", policy, processor, cfg, run)
    g = a.rl.gtr
    say("agent_rl", f"{a.rl.algorithm}: {a.rl.steps} steps x {a.rl.seeds_per_step} layouts x {a.rl.group_size} plays"
                    + (f", GTR-Turbo {g.guidance} guidance from the {g.merge} merge of its checkpoints" if g.guidance != "none" else "")
                    + (f"; resuming after step {resumed}" if resumed else ""))
    history: list[dict] = []
    log_step = step_logger("agent_rl", run, every_print=max(1, a.rl.steps // 10))

    def log(step: int, metrics: dict) -> None:
        history.append({"step": step, **metrics})
        log_step(step, metrics)

    saved = run_agent_rl(policy, processor, a, cfg.world.image_size, out, cfg.seed, on_log=log,
                         state_dir=out / STATE, inputs_digest=digest, on_state_saved=lambda step: drop_previous(out))
    drop_previous(out)
    run.log_model(saved[-1], "agent-rl-final", params=a.rl.model_dump(exclude={"gtr"}))
    end = _eval("end", policy, processor, cfg, run)
    summary = {"start": start, "end": end, "resumed_after_step": resumed, "checkpoints": len(saved)}
    if (out / MERGED_TEACHER).exists():
        teacher, _ = load_student(out / MERGED_TEACHER)
        summary["merged_teacher"] = _eval("merged_teacher", teacher, processor, cfg, run)
    if history:  # training rollouts (sampled): the first and last quarter of the steps this process ran
        k = max(1, len(history) // 4)
        summary["train"] = {f"{key}_{part}": sum(h[key] for h in rows) / len(rows)
                            for key in ("success_rate", "format_error_rate", "entropy", "return")
                            for part, rows in (("first_quarter", history[:k]), ("last_quarter", history[-k:]))}
        (root / AGENT_REPORT).mkdir(parents=True, exist_ok=True)
        pd.DataFrame(history).to_csv(root / AGENT_REPORT / "train_curve.csv", index=False)
    return summary


def run(cfg: Config, root: Path, run) -> None:
    summary = train(cfg, root, run)
    (root / AGENT_REPORT).mkdir(parents=True, exist_ok=True)
    (root / AGENT_REPORT / "summary.json").write_text(json.dumps(summary, indent=1))
    flat = {f"{m}.{k}": summary[m][k] for m in ("start", "end", "merged_teacher") if m in summary
            for k in ("success_rate", "format_error_rate", "entropy", "turns_per_episode")}
    write_stage_metrics(root, "agent_rl", {**flat, **summary.get("train", {})})
