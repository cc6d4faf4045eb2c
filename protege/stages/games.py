"""The two multi-turn games' stage layout: which params section, warm start, checkpoints and report each uses.
agent_sft / agent_rl train on the agent game (`agent.env`: grid or points24; GTR-Turbo), tool_sft / tool_rl on
the tool environment (GTPO); the recipes are shared."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from protege.config import Config
from protege.paths import AGENT_REPORT, AGENT_RL, AGENT_SFT_MODEL, TOOL_REPORT, TOOL_RL, TOOL_SFT_MODEL


@dataclass(frozen=True)
class GameLayout:
    section: str        # params section: agent | tool
    sft_model: Path     # the warm start
    rl_dir: Path        # RL checkpoints (+ state/, merged-teacher/)
    report: Path        # summary.json, train_curve.csv
    what: str           # how a report names one held-out episode's setting

    @property
    def sft_stage(self) -> str:
        return f"{self.section}_sft"

    @property
    def rl_stage(self) -> str:
        return f"{self.section}_rl"

    def config(self, cfg: Config):
        return getattr(cfg, self.section)


GAMES = {"agent": GameLayout("agent", AGENT_SFT_MODEL, AGENT_RL, AGENT_REPORT, "layouts"),
         "tool": GameLayout("tool", TOOL_SFT_MODEL, TOOL_RL, TOOL_REPORT, "questions")}
