"""agent_sft: the agent game's warm start, supervised on the scripted solver's episodes (train seeds).
`run_game(cfg, cfg.tool, ...)` is the same recipe for the tool environment (the tool_sft stage)."""
from __future__ import annotations

import shutil
from pathlib import Path

from protege.config import Config, tracked_params
from protege.models.student import save_student
from protege.paths import BASE_MODEL, TRAINING_STATES
from protege.rollout.games import game_params, is_tool
from protege.stages.common import inputs_digest, say, step_logger, write_stage_metrics
from protege.stages.student_model import base_model_dir, load_model, log_start_model, model_path
from protege.stages.games import GAMES
from protege.train.agent_sft import train_agent_sft

# a game section is handed to its warm start whole; its RL section and the final evaluation's settings are the RL
# stage's, so changing them leaves the warm start up to date (protege/stage_deps.py reads this literal)
NOT_READ = {"agent": ["rl", "eval_episodes", "eval_batch"], "tool": ["rl", "eval_episodes", "eval_batch"]}


def _describe(g, image_size: int) -> str:
    if is_tool(g):
        t = g.task
        return f"tool environment ({', '.join(t.kinds)}; at most {t.max_tool_calls} tool calls, sandboxed)"
    return f"{g.env} {game_params(g, image_size).describe()}"


def run_game(cfg: Config, game_cfg, root: Path, mlrun) -> None:
    """The recipe for the game whose params section is `game_cfg` (cfg.agent or cfg.tool)."""
    game = "tool" if is_tool(game_cfg) else "agent"
    layout = GAMES[game]
    g, name = layout.config(cfg), layout.sft_stage
    env_params = g.task.model_dump() if is_tool(g) else getattr(g, g.env).model_dump()
    mlrun.log_params({"env": g.env, **env_params, **tracked_params(g.sft)}, f"{layout.section}.")
    start = base_model_dir(cfg, root)
    log_start_model(cfg, root, mlrun, start, "init")
    model, processor = load_model(cfg, start)
    say(name, f"{g.sft.steps} steps x {g.sft.batch_size} of {g.sft.episodes} solver episodes ({_describe(g, cfg.world.image_size)})")
    state = root / TRAINING_STATES / name
    digest = cfg.model.digest if model_path(cfg, root) is not None else inputs_digest(root, [BASE_MODEL])
    summary = train_agent_sft(model, processor, g, cfg.world.image_size, cfg.seed,
                              on_log=step_logger(name, mlrun, every_print=max(1, g.sft.steps // 5)),
                              state_dir=state, inputs_digest=digest or "")
    resumed = summary["resumed_after_step"]
    save_student(model, processor, root / layout.sft_model)
    shutil.rmtree(state, ignore_errors=True)  # the checkpoint is written: a finished run needs no state
    mlrun.log_model(root / layout.sft_model, name.replace("_", "-"), params=g.sft.model_dump())
    write_stage_metrics(root, name, summary)
    say(name, f"loss {summary['loss']:.4f} after {g.sft.steps} steps on {summary['turns']} solver turns "
              f"-> {layout.sft_model}" + (f" (resumed after step {resumed})" if resumed else ""))


def run(cfg: Config, root: Path, run) -> None:
    run_game(cfg, cfg.agent, root, run)
