"""agent_rl: multi-turn RL on the agent game from the warm start, guided by GTR-Turbo's merged teacher
when agent.rl.gtr.guidance is sft or kl. Success rate on held-out layouts before and after (and of the
merged teacher), with bootstrap CIs, in reports/agent/summary.json; resumable like the rl stage.
`run_game(cfg, cfg.tool, ...)` / `train(..., game="tool")` is the same recipe on the tool environment (tool_rl)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from protege.config import Config, tracked_params
from protege.eval.agent import evaluate_agent

from protege.rl.agent_loop import agent_fingerprint, run_agent_rl
from protege.rollout.games import is_tool
from protege.stages.common import QuietRun, StepHistory, inputs_digest, say, step_logger, write_stage_metrics
from protege.stages.student_model import load_model, with_lora
from protege.stages.games import GAMES, GameLayout
from protege.runtime.distributed import on_rank0, world
from protege.runtime.placement import resolve_device
from protege.runtime.run_folder import drop_previous, prepare_out_dir

STATE = "state"
MERGED_TEACHER = "merged-teacher"
TRAIN_CURVE = "train_curve.csv"  # in the game's report folder: one row per step


TOOL_FIGURES = ("accuracy", "runtime_error_rate", "tool_calls_per_episode", "runtime_errors_per_call")


def _eval(name: str, model, processor, cfg: Config, mlrun, layout: GameLayout) -> dict:
    r = evaluate_agent(model, processor, layout.config(cfg), cfg.world.image_size, seed=cfg.seed)
    mlrun.log_metrics({f"{name}.success_rate": r["success_rate"], f"{name}.entropy": r["entropy"],
                     f"{name}.format_error_rate": r["format_error_rate"],
                     **{f"{name}.{k}": r[k] for k in TOOL_FIGURES if k in r}})
    tools = (f", runtime errors in {100 * r['runtime_error_rate']:.1f}% of episodes, "
             f"{r['tool_calls_per_episode']:.2f} tool calls per episode" if "runtime_error_rate" in r else "")
    say(layout.rl_stage, f"{name}: success {100 * r['success_rate']:.1f}% [{100 * r['success_ci'][0]:.1f}, "
                         f"{100 * r['success_ci'][1]:.1f}] on {r['episodes']} held-out {layout.what}, format errors "
                         f"{100 * r['format_error_rate']:.1f}% of turns, entropy {r['entropy']:.3f}{tools}")
    return r


def train(cfg: Config, root: Path, mlrun, game: str = "agent") -> dict:
    """The whole recipe (the study runs it in its own folders): returns the summary with per-episode results.
    Under several processes every rank trains on its share of each step's layouts; rank 0 alone prepares the
    folder, evaluates, records and writes (the others return {})."""
    t0 = time.perf_counter()
    lead = world()[0] == 0
    if not lead:
        mlrun = QuietRun()
    layout = GAMES[game]
    a = layout.config(cfg)
    mlrun.log_params(tracked_params(a.rl), f"{game}.rl.")  # gtr.* and gtpo.* flattened
    mlrun.log_input(layout.sft_model, context="init")
    digest = inputs_digest(root, [layout.sft_model])
    out = root / layout.rl_dir
    resumed = on_rank0(lambda: prepare_out_dir(out, agent_fingerprint(a, cfg.seed, digest), a.rl.steps))
    policy, processor = load_model(cfg, root / layout.sft_model, resolve_device(a.rl.device, f"{game}.rl.device"))
    start = _eval("start", policy, processor, cfg, mlrun, layout) if lead else {}
    policy = with_lora(cfg, policy, a.rl.trainable)
    g, p = a.rl.gtr, a.rl.gtpo
    say(layout.rl_stage, f"{a.rl.algorithm}: {a.rl.steps} steps x {a.rl.seeds_per_step} {layout.what} x {a.rl.group_size} plays"
                    + (f" (gamma {p.gamma}, {p.scope}-normalised advantages, shaping alpha {p.shaping_alpha})"
                       if a.rl.algorithm == "gtpo" else "")
                    + (f", GTR-Turbo {g.guidance} guidance from the {g.merge} merge of its checkpoints" if g.guidance != "none" else "")
                    + (f"; resuming after step {resumed}" if resumed else ""))
    # every step's figures (the thought-collapse figures, the held-out curve's points), kept across a resume
    curve = StepHistory(root / layout.report / TRAIN_CURVE if lead else None, resumed)
    log_step = step_logger(layout.rl_stage, mlrun, every_print=max(1, a.rl.steps // 10))

    def log(step: int, metrics: dict) -> None:
        curve.add(step, metrics)
        log_step(step, metrics)

    saved = run_agent_rl(policy, processor, a, cfg.world.image_size, out, cfg.seed, on_log=log if lead else None,
                         state_dir=out / STATE, inputs_digest=digest,
                         on_state_saved=lambda step: drop_previous(out) if lead else None)
    if not lead:
        return {}
    drop_previous(out)
    mlrun.log_model(saved[-1], f"{game}-rl-final", params={k: v for k, v in tracked_params(a.rl).items()
                                                                      if k not in ("gtr", "gtpo")})
    end = _eval("end", policy, processor, cfg, mlrun, layout)
    summary = {"start": start, "end": end, "resumed_after_step": resumed, "checkpoints": len(saved)}
    if (out / MERGED_TEACHER).exists():
        teacher, _ = load_model(cfg, out / MERGED_TEACHER)
        summary["merged_teacher"] = _eval("merged_teacher", teacher, processor, cfg, mlrun, layout)
    history = curve.rows
    if history:  # training rollouts (sampled): the first and last quarter of the run's steps
        k = max(1, len(history) // 4)
        summary["train"] = {f"{key}_{part}": sum(h[key] for h in rows) / len(rows)
                            for key in ("success_rate", "format_error_rate", "entropy", "return",
                                        "tool_calls_per_episode", "runtime_error_rate", "shaping_reward_mean")
                            if all(key in h for h in history)
                            for part, rows in (("first_quarter", history[:k]), ("last_quarter", history[-k:]))}
    summary["seconds"] = time.perf_counter() - t0
    return summary


def run_game(cfg: Config, game_cfg, root: Path, mlrun) -> None:
    """The recipe for the game whose params section is `game_cfg` (cfg.agent or cfg.tool)."""
    game = "tool" if is_tool(game_cfg) else "agent"
    layout = GAMES[game]
    summary = train(cfg, root, mlrun, game)
    if not summary:  # a rank other than 0: rank 0 writes the reports
        return
    (root / layout.report).mkdir(parents=True, exist_ok=True)
    (root / layout.report / "summary.json").write_text(json.dumps(summary, indent=1))
    flat = {f"{m}.{k}": summary[m][k] for m in ("start", "end", "merged_teacher") if m in summary
            for k in ("success_rate", "format_error_rate", "entropy", "turns_per_episode", *TOOL_FIGURES)
            if k in summary[m]}
    # seconds: what a study scales its expected time from (protege/study/estimate.py)
    write_stage_metrics(root, layout.rl_stage, {**flat, **summary.get("train", {}), "seconds": summary["seconds"]})


def run(cfg: Config, root: Path, run) -> None:
    run_game(cfg, cfg.agent, root, run)
