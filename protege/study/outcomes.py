"""What a finished run's result.json holds for one model: the outcomes the runner logs and every study report
(qa, game, the results table) reads. Kept apart from the runner so that the reports need not import it."""
from __future__ import annotations

from protege.study.spec import GAME_TASKS

AGENT_MODELS = {"rl_final": "end", "merged": "merged_teacher"}  # a game study's `model` -> its evaluation


def game_summary(result: dict) -> dict | None:
    """A game run's summary (the agent_rl recipe's), kept under the game's name ("agent", "tool")."""
    return next((result[g] for g in GAME_TASKS if g in result), None)


def model_result(result: dict, model: str) -> dict:
    """A run's results for `model` (rl_final | merged); a run without RL has only the SFT checkpoint's.
    A game run's are its evaluations: `end` (rl_final), `merged_teacher` (merged), `start` (the warm start)."""
    if (summary := game_summary(result)) is not None:
        return summary.get(AGENT_MODELS[model]) or summary["start"]
    return result["models"].get(model) or result["models"]["sft"]
