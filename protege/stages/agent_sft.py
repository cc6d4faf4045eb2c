"""agent_sft: the agent game's warm start, supervised on the scripted solver's episodes (train seeds)."""
from __future__ import annotations

from pathlib import Path

from protege.config import Config
from protege.models.student import load_student, save_student
from protege.paths import AGENT_SFT_MODEL, BASE_MODEL
from protege.stages.common import say, step_logger, write_stage_metrics
from protege.train.agent_sft import train_agent_sft


def run(cfg: Config, root: Path, run) -> None:
    a = cfg.agent
    run.log_params({"env": a.env, **a.grid.model_dump(), **a.sft.model_dump()}, "agent.")
    run.log_input(BASE_MODEL, context="init")
    model, processor = load_student(root / BASE_MODEL)
    say("agent_sft", f"{a.sft.steps} steps x {a.sft.batch_size} of {a.sft.episodes} solver episodes "
                     f"({a.env} {a.grid.size}x{a.grid.size}, {a.grid.walls} walls, at most {a.grid.max_turns} turns)")
    summary = train_agent_sft(model, processor, a, cfg.world.image_size, cfg.seed,
                              on_log=step_logger("agent_sft", run, every_print=max(1, a.sft.steps // 5)))
    save_student(model, processor, root / AGENT_SFT_MODEL)
    run.log_model(root / AGENT_SFT_MODEL, "agent-sft", params=a.sft.model_dump())
    write_stage_metrics(root, "agent_sft", summary)
    say("agent_sft", f"loss {summary['loss']:.4f} after {a.sft.steps} steps on {summary['turns']} solver turns "
                     f"-> {AGENT_SFT_MODEL}")
