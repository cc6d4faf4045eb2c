"""The multi-turn games the agent recipes train on, behind one face: an environment factory, the longest
episode, the scripted solver's episodes and where an output's action begins. `agent` (AgentConfig) is the game
`agent.env` names (grid or points24: its class, params and solver come from protege.world.envs.ENVS, its
settings from the section of that name), `tool` (ToolConfig) the tool-use environment whose python blocks run
in the sandbox."""
from __future__ import annotations

import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from protege.config import AgentConfig, ToolConfig
from protege.generation.transformers_backend import Sampling
from protege.world.envs import env_spec, make_params, train_seed

Game = AgentConfig | ToolConfig


def is_tool(cfg: Game) -> bool:
    return getattr(cfg, "env", None) == "tool"


def sandbox_for(cfg: ToolConfig):
    """The sandbox every environment of a run shares (it is thread-safe); refuses without bubblewrap unless
    `sandbox.unsafe` is set."""
    from protege.tools.sandbox import Limits, Sandbox

    # every configured limit, by name: a field added to both cannot be left behind here
    return Sandbox(Limits(**cfg.sandbox.model_dump(exclude={"unsafe"})), unsafe=cfg.sandbox.unsafe)


def tool_params(cfg: ToolConfig, image_size: int):
    from protege.world.envs.tool import ToolParams

    t = cfg.task
    return ToolParams(image_size=image_size, max_tool_calls=t.max_tool_calls, kinds=tuple(t.kinds),
                      correct_reward=t.correct_reward, format_penalty=t.format_penalty,
                      no_tool_penalty=t.no_tool_penalty, tool_error_penalty=t.tool_error_penalty,
                      tool_output_chars=t.tool_output_chars)


def game_params(cfg: AgentConfig, image_size: int):
    """The agent game's params (GridParams, Points24Params, ...) from its config section (`agent.<env>`)."""
    return make_params(cfg.env, image_size=image_size, **getattr(cfg, cfg.env).model_dump())


def action_start_for(cfg: Game) -> Callable[[str], int | None]:
    """Where the configured game's action part begins in an output (None: no action, all of it is thought)."""
    return env_spec(cfg.env).action_start


def env_factory(cfg: Game, image_size: int) -> Callable[[], object]:
    """A function building fresh environments of the configured game (one sandbox for all of them)."""
    if is_tool(cfg):
        from protege.world.envs.tool import ToolEnv

        params, sandbox = tool_params(cfg, image_size), sandbox_for(cfg)
        return lambda: ToolEnv(params, sandbox)
    env_cls, params = env_spec(cfg.env).env, game_params(cfg, image_size)
    return lambda: env_cls(params)


def max_turns(cfg: Game) -> int:
    """The most policy turns an episode can have: tool calls plus the final answer, or the game's limit."""
    return cfg.task.max_tool_calls + 1 if is_tool(cfg) else getattr(cfg, cfg.env).max_turns


def sampling_for(cfg: Game, **kw) -> Sampling:
    """Generation settings of a turn: a tool game's turn ends at its closed code block."""
    return Sampling(max_new_tokens=cfg.rl.max_new_tokens, stop_at_code_block=is_tool(cfg), **kw)


def expert_episodes(cfg: Game, image_size: int, n: int) -> list[list]:
    """The scripted solver's episodes on train seeds 0..n-1: per episode, (observation, solver text) per turn.
    The tool game's solver runs its code through the sandbox, exactly as the trainer would."""
    if is_tool(cfg):
        from protege.world.envs.tool_solver import expert_episode

        params, sandbox = tool_params(cfg, image_size), sandbox_for(cfg)
        # a slip is drawn from the episode's own seed, so the data does not depend on n or on thread order
        slips = [random.Random(f"slip-{i}").random() < cfg.solver_slips for i in range(n)]
        # each episode waits on its sandboxed process: threads overlap those waits (the sandbox is thread-safe)
        with ThreadPoolExecutor(max_workers=min(8, 2 * (os.cpu_count() or 1))) as pool:
            return list(pool.map(lambda i: expert_episode(params, train_seed(i), sandbox, slips[i]), range(n)))
    params, solver = game_params(cfg, image_size), env_spec(cfg.env).expert_episode
    return [solver(params, train_seed(i)) for i in range(n)]
