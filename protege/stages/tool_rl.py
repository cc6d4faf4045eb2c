"""tool_rl: multi-turn tool-integrated RL (GTPO by default; grpo / dr_grpo for comparison) from the tool
environment's warm start. Accuracy, runtime-error rate and tool calls on held-out questions before and after,
in reports/tool/summary.json; resumable like agent_rl."""
from __future__ import annotations

from pathlib import Path

from protege.config import Config
from protege.stages.agent_rl import run_game


def run(cfg: Config, root: Path, run) -> None:
    run_game(cfg, cfg.tool, root, run)
