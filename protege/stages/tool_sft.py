"""tool_sft: the tool environment's warm start, supervised on the scripted solver's tool-using episodes
(its python blocks run in the sandbox, as the trainer's do)."""
from __future__ import annotations

from pathlib import Path

from protege.config import Config
from protege.stages.agent_sft import run_game


def run(cfg: Config, root: Path, run) -> None:
    run_game(cfg, cfg.tool, root, run)
