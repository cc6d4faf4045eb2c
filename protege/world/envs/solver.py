"""The scripted expert for grid navigation: BFS shortest-path moves, written as the model should write
them (a thought stating both positions from the true state, then the action). Its episodes are the
SFT warm-start data before agent RL."""
from __future__ import annotations

from protege.world.envs.grid import (ACTIONS, BLOCKED, INSTRUCTION, UNPARSED, GridEnv, GridParams,
                                     GridState, Observation, distances, neighbour, observation_text)

THOUGHT = "I am at row {ar}, column {ac}. The goal is at row {gr}, column {gc}."


def best_move(state: GridState) -> str:
    """A move on a shortest path to the goal: the first of up/down/left/right that brings the agent one
    step closer (so ties are broken in that order)."""
    dist = distances(state.size, state.walls, state.goal)  # from the goal: the agent's distance to it
    here = dist.get(state.agent)
    if here is None:
        raise ValueError(f"no path from the agent at {state.agent} to the goal at {state.goal}")
    if here == 0:
        raise ValueError(f"the agent is already on the goal at {state.goal}")
    return next(a for a in ACTIONS if dist.get(neighbour(state.agent, a)) == here - 1)


def solve(env_state: GridState | GridEnv) -> str:
    """The expert's whole turn output, e.g.
    "I am at row 2, column 1. The goal is at row 0, column 3. Action: up"."""
    state = env_state.state if isinstance(env_state, GridEnv) else env_state
    thought = THOUGHT.format(ar=state.agent[0], ac=state.agent[1], gr=state.goal[0], gc=state.goal[1])
    return f"{thought} Action: {best_move(state)}"


def expert_episode(params: GridParams, seed: int) -> list[tuple[Observation, str]]:
    """The episode of `seed` played by the solver: each turn's observation and the solver's output.
    It always reaches the goal (layouts keep the goal within max_turns moves)."""
    env = GridEnv(params)
    obs = env.reset(seed)
    turns = []
    while True:
        text = solve(env.state)
        turns.append((obs, text))
        result = env.step(text)
        if result.done:
            break
        obs = result.observation
    if not env.success:
        raise RuntimeError(f"the solver failed seed {seed} with {params}: a layout bug")
    return turns


def all_texts(params: GridParams = GridParams()) -> list[str]:
    """Every observation text and every solver output the game can produce with `params` (for training
    the tokenizer on the world's text)."""
    texts = [INSTRUCTION, BLOCKED, UNPARSED]
    texts += [observation_text(t, params.max_turns, last) for t in range(1, params.max_turns)
              for last in (None, "blocked", "unparsed")]
    n = params.size
    cells = [(r, c) for r in range(n) for c in range(n)]
    texts += [THOUGHT.format(ar=a[0], ac=a[1], gr=g[0], gc=g[1]) for a in cells for g in cells if a != g]
    texts += [f"Action: {a}" for a in ACTIONS]
    return texts
