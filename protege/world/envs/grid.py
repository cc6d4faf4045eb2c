"""Grid navigation: a seeded multi-turn visual game for agent RL (GTR-Turbo style).

An N x N grid drawn on an `image_size` pixel image: the agent (a red filled square), the goal (a green
filled square), `walls` wall cells (dark grey) and empty cells (white), each cell outlined by a thin
light-grey line drawn inside the cell. With the defaults (N=4, 64 px) each cell is exactly one 16x16
image token of the student, and every token's pixels depend only on its own cell.

Each turn the model writes a free thought, then `Action: <up|down|left|right>` (see `parse_action`);
row 0 is the top row, column 0 the left column. The positions are never in the text: the model must
read them from the image.

Rewards per turn: `legal_reward` when the text parses and the move stays on the grid and off the walls
(the agent moves); `illegal_reward` otherwise (the agent stays). Reaching the goal adds
`success_reward` on that turn and ends the episode; it also ends when `turn == max_turns`.

Seeds: `reset(seed)` draws the layout from `random.Random(seed)` alone, so the same seed (and params)
always gives the same layout. Training uses `train_seed(i) = i` for 0 <= i < EVAL_SEED_OFFSET and
evaluation `eval_seed(i) = EVAL_SEED_OFFSET + i`, so the two never overlap.
"""
from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from PIL import Image, ImageDraw

from protege.world.scenes import COLOURS

Cell = tuple[int, int]  # (row, column); row 0 is the top row, column 0 the left column

ACTIONS = ("up", "down", "left", "right")  # also the solver's tie-break order
MOVES: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

EVAL_SEED_OFFSET = 10**6
MAX_DRAWS = 10_000  # layout redraws before giving up (only reachable with near-full walls on big grids)

AGENT_COLOUR = COLOURS["red"]
GOAL_COLOUR = COLOURS["green"]
WALL_COLOUR = (70, 70, 70)
EMPTY_COLOUR = (255, 255, 255)
LINE_COLOUR = (190, 190, 190)

INSTRUCTION = ("Move the red square onto the green square. "
               "Answer with a thought, then 'Action: up', 'down', 'left' or 'right'.")
BLOCKED = "Your last move was blocked."
UNPARSED = "Your last answer had no valid action."


def train_seed(i: int) -> int:
    """The i-th training layout seed (0 <= i < EVAL_SEED_OFFSET); never equal to any `eval_seed`."""
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < EVAL_SEED_OFFSET:
        raise ValueError(f"train seed index must be an int in [0, {EVAL_SEED_OFFSET}), got {i!r}")
    return i


def eval_seed(i: int) -> int:
    """The i-th evaluation layout seed (i >= 0): EVAL_SEED_OFFSET + i, above every `train_seed`."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ValueError(f"eval seed index must be an int >= 0, got {i!r}")
    return EVAL_SEED_OFFSET + i


def _check_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"GridParams.{name} must be an int, got {value!r}")
    return value


@dataclass(frozen=True)
class GridParams:
    size: int = 4          # cells per side
    walls: int = 2         # wall cells in a randomly drawn layout (`reset`); `from_layout` takes its own
    max_turns: int = 8
    image_size: int = 64   # pixels per side; a multiple of `size`
    legal_reward: float = 0.05
    illegal_reward: float = -0.5
    success_reward: float = 1.0

    def __post_init__(self) -> None:
        for name in ("size", "walls", "max_turns", "image_size"):
            _check_int(name, getattr(self, name))
        if self.size < 2:
            raise ValueError(f"GridParams.size must be >= 2, got {self.size}")
        if not 0 <= self.walls <= self.size * self.size - 2:
            raise ValueError(f"GridParams.walls must be in [0, size*size - 2] = [0, {self.size ** 2 - 2}] "
                             f"to leave room for the agent, the goal and a path, got {self.walls}")
        if self.max_turns < 1:
            raise ValueError(f"GridParams.max_turns must be >= 1, got {self.max_turns}")
        if self.image_size % self.size:
            raise ValueError(f"GridParams.image_size must be divisible by size={self.size} "
                             f"(whole-pixel cells), got {self.image_size}")
        if self.image_size // self.size < 4:
            raise ValueError(f"GridParams.image_size must give cells of at least 4 px, i.e. be >= "
                             f"{4 * self.size} for size={self.size}, got {self.image_size}")
        for name in ("legal_reward", "illegal_reward", "success_reward"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
                raise ValueError(f"GridParams.{name} must be a number, got {value!r}")

    @property
    def cell_px(self) -> int:
        return self.image_size // self.size

    def describe(self) -> str:
        return f"{self.size}x{self.size}, {self.walls} walls, at most {self.max_turns} turns"


@dataclass(frozen=True)
class GridState:
    """What the board looks like: everything `render` and the solver need."""
    size: int
    agent: Cell
    goal: Cell
    walls: frozenset[Cell]

    def inside(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.size and 0 <= cell[1] < self.size

    def free(self, cell: Cell) -> bool:
        """On the grid and not a wall: a cell the agent may step onto."""
        return self.inside(cell) and cell not in self.walls


@dataclass
class Observation:
    image: Image.Image
    text: str


@dataclass
class StepResult:
    observation: Observation | None  # None once done
    reward: float
    done: bool
    info: dict  # {"legal": bool, "parsed": bool, "action": str | None, "success": bool, "turn": int}


def neighbour(cell: Cell, action: str) -> Cell:
    dr, dc = MOVES[action]
    return cell[0] + dr, cell[1] + dc


def distances(size: int, walls: Iterable[Cell], start: Cell) -> dict[Cell, int]:
    """BFS step counts from `start` to every cell reachable from it (walls block, `start` counts 0)."""
    state = GridState(size, start, start, frozenset(walls))
    dist = {start: 0}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        for action in ACTIONS:
            nxt = neighbour(cell, action)
            if nxt not in dist and state.free(nxt):
                dist[nxt] = dist[cell] + 1
                queue.append(nxt)
    return dist


def bfs_distance(state: GridState) -> int | None:
    """Shortest number of moves from the agent to the goal, or None when no path exists."""
    return distances(state.size, state.walls, state.agent).get(state.goal)


def draw_layout(params: GridParams, seed: int) -> GridState:
    """The layout for `seed`, from `random.Random(seed)` alone: the agent, then the walls on other
    cells, then the goal among the cells the agent can reach in 1..max_turns moves; redrawn when there
    are none. So the goal is always reachable, and within the turn limit."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    n = params.size
    cells = [(r, c) for r in range(n) for c in range(n)]
    for _ in range(MAX_DRAWS):
        agent = rng.choice(cells)
        walls = frozenset(rng.sample([c for c in cells if c != agent], params.walls))
        dist = distances(n, walls, agent)
        goals = [c for c in cells if 1 <= dist.get(c, 0) <= params.max_turns]
        if goals:
            return GridState(n, agent, rng.choice(goals), walls)
    raise RuntimeError(f"no solvable layout in {MAX_DRAWS} draws for {params} and seed {seed}; "
                       f"use fewer walls")


def render(state: GridState, image_size: int) -> Image.Image:
    """The board as an RGB image: a pure function of (state, image_size)."""
    if image_size % state.size or image_size // state.size < 4:
        raise ValueError(f"image_size must be a multiple of size={state.size} with cells of >= 4 px, "
                         f"got {image_size}")
    cell = image_size // state.size
    img = Image.new("RGB", (image_size, image_size), EMPTY_COLOUR)
    draw = ImageDraw.Draw(img)
    inset = max(1, cell // 8)  # 2 px in a 16 px cell: the outline, then a white gap, then the square

    def box(rc: Cell, margin: int) -> list[int]:
        x0, y0 = rc[1] * cell, rc[0] * cell
        return [x0 + margin, y0 + margin, x0 + cell - 1 - margin, y0 + cell - 1 - margin]

    for r in range(state.size):
        for c in range(state.size):
            draw.rectangle(box((r, c), 0), outline=LINE_COLOUR)
    for wall in sorted(state.walls):
        draw.rectangle(box(wall, 1), fill=WALL_COLOUR)
    draw.rectangle(box(state.goal, inset), fill=GOAL_COLOUR)
    # on the goal (the final board), the agent is drawn smaller so a green rim still shows
    agent_margin = inset if state.agent != state.goal else max(inset + 1, cell // 4)
    draw.rectangle(box(state.agent, agent_margin), fill=AGENT_COLOUR)
    return img


# One "Action:" marker (as a word, any case), one of the four moves, then at most a full stop.
_MARKER = re.compile(r"(?<![A-Za-z0-9_])action:", re.IGNORECASE)
_ACTION = re.compile(r"action:\s*(up|down|left|right)\s*\.?\s*\Z", re.IGNORECASE)


def action_start(text: str) -> int | None:
    """Where the action part ("Action: ...") begins in `text`: everything before it is the thought.
    None when `text` does not parse (see `parse_action`)."""
    markers = list(_MARKER.finditer(text))
    if len(markers) != 1 or not _ACTION.match(text, markers[0].start()):
        return None
    return markers[0].start()


def parse_action(text: str) -> str | None:
    """The move in a model's whole turn output, lower-cased, or None unless it is exactly
    `<thought> Action: <up|down|left|right>`: exactly one `Action:` marker (case-insensitive, not
    inside a word, e.g. "reaction:" is no marker), then one of the four words, then nothing but
    whitespace and at most one full stop. The thought may be empty."""
    start = action_start(text)
    if start is None:
        return None
    match = _ACTION.match(text, start)
    assert match is not None
    return match.group(1).lower()


def observation_text(turn: int, max_turns: int, last: str | None = None) -> str:
    """The text shown before move `turn + 1`: the task on the first turn, then the turn count, what went
    wrong last turn (`last`: "blocked", "unparsed" or None) and the task again (a policy that sees only the
    current observation still reads the rules)."""
    if turn == 0:
        return INSTRUCTION
    text = f"Turn {turn + 1} of {max_turns}."
    if last == "blocked":
        text += " " + BLOCKED
    elif last == "unparsed":
        text += " " + UNPARSED
    return text + " " + INSTRUCTION


class GridEnv:
    """One grid-navigation game at a time; `reset(seed)` starts one, `step(text)` plays a turn."""

    def __init__(self, params: GridParams = GridParams()) -> None:
        if not isinstance(params, GridParams):
            raise ValueError(f"params must be a GridParams, got {type(params).__name__}")
        self.params = params
        self._state: GridState | None = None
        self._seed: int | None = None
        self._turn = 0
        self._done = False
        self._success = False
        self._last: str | None = None

    @classmethod
    def from_layout(cls, params: GridParams, agent: Cell, goal: Cell, walls: Iterable[Cell]) -> GridEnv:
        """An env at turn 0 of a given layout (for tests and hand-made boards); `params.walls` is not
        used. The layout needs no path to the goal, but cells must be on the grid and distinct."""
        env = cls(params)
        state = GridState(params.size, tuple(agent), tuple(goal), frozenset(tuple(w) for w in walls))
        for name, cell in [("agent", state.agent), ("goal", state.goal)] + [("wall", w) for w in state.walls]:
            if len(cell) != 2 or not state.inside(cell):
                raise ValueError(f"{name} {cell} must be a (row, column) inside the {params.size}x{params.size} grid")
        if state.agent == state.goal:
            raise ValueError(f"agent and goal must differ, both at {state.agent}")
        if state.agent in state.walls or state.goal in state.walls:
            raise ValueError("walls must not cover the agent or the goal")
        env._start(state, seed=None)
        return env

    def _start(self, state: GridState, seed: int | None) -> Observation:
        self._state, self._seed = state, seed
        self._turn, self._done, self._success, self._last = 0, False, False, None
        return self.observation()

    def reset(self, seed: int) -> Observation:
        return self._start(draw_layout(self.params, seed), seed)

    def observation(self) -> Observation:
        state = self.state
        return Observation(render(state, self.params.image_size),
                           observation_text(self._turn, self.params.max_turns, self._last))

    def step(self, text: str) -> StepResult:
        state = self.state
        if self._done:
            raise RuntimeError(f"the episode is over (turn {self._turn}, success={self._success}); "
                               f"call reset(seed) before stepping again")
        p = self.params
        action = parse_action(text)
        legal = action is not None and state.free(neighbour(state.agent, action))
        if legal:
            state = GridState(state.size, neighbour(state.agent, action), state.goal, state.walls)
            self._state = state
            reward = p.legal_reward
            self._last = None
        else:
            reward = p.illegal_reward
            self._last = "blocked" if action is not None else "unparsed"
        self._turn += 1
        self._success = state.agent == state.goal
        if self._success:
            reward += p.success_reward
        self._done = self._success or self._turn >= p.max_turns
        info = {"legal": legal, "parsed": action is not None, "action": action,
                "success": self._success, "turn": self._turn}
        return StepResult(None if self._done else self.observation(), float(reward), self._done, info)

    @property
    def state(self) -> GridState:
        if self._state is None:
            raise RuntimeError("no episode yet: call reset(seed) first")
        return self._state

    @property
    def agent(self) -> Cell:
        return self.state.agent

    @property
    def goal(self) -> Cell:
        return self.state.goal

    @property
    def walls(self) -> frozenset[Cell]:
        return self.state.walls

    @property
    def seed(self) -> int | None:
        """The seed of the current layout (None for `from_layout` boards)."""
        return self._seed

    @property
    def turn(self) -> int:
        """Turns played in this episode (0 right after reset)."""
        return self._turn

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool:
        return self._success

