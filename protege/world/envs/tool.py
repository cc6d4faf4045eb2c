"""Tool use: a seeded multi-turn visual question that needs exact computation (GTPO-style tool-integrated
reasoning).

Each episode is one question about one image whose answer is an integer:
- "arithmetic": two 2-digit numbers drawn as seven-segment digits, one digit per image cell (the top number
  on cell row 0, the bottom one on row 2, both in columns 0-1); the text asks for their sum, difference or
  product.
- "chart": four bars (red, green, blue, yellow in a seeded order), one bar per cell column, values 1..6;
  the text asks for the sum, difference or product of two named bars, or the sum or product of all bars.
- "count": 1..8 shapes (scenes.random_scene); the text asks for the count times a factor 11..99.
With the defaults (64 px, a 4x4 grid of 16 px cells) each digit, bar column or shape sits in its own image
token(s) of the student, as in the grid game.

Each turn the model either writes a python code block (the FIRST closed ```python ... ``` or ``` ... ```
block, see `extract_code`), which runs in the sandbox and whose output comes back as a text-only tool turn,
or a final answer `\\boxed{N}` (see `extract_boxed` / `parse_int`), which ends the episode. A code block
wins over a boxed answer in the same turn. Rewards per turn: 0 for a tool call that ran cleanly,
`tool_error_penalty` for one that errored or hit a sandbox limit (0 by default, as in GTPO), `correct_reward`
for a right final answer (0 for a wrong or unparseable one) plus `no_tool_penalty` when the episode answered
without ever calling the tool (while it could), and `format_penalty` for a turn with neither a code block nor a
boxed answer, or a code block once `max_tool_calls` are spent; those two end the episode as failed. GTPO's
turn reward is correctness plus a format term: -0.1 for a format error or no tool call.

Seeds: `reset(seed)` draws the question from `random.Random(seed)` alone, so the same seed and params always
give the same question; train on `train_seed(i)`, evaluate on `eval_seed(i)` (the grid game's split).
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from PIL import Image, ImageDraw

from protege.world.envs.grid import EVAL_SEED_OFFSET, eval_seed, train_seed
from protege.world.scenes import BAR_COLOURS, Scene, draw_bars, draw_scene, random_bars, random_scene

__all__ = ["CELLS", "DIGIT_SEGMENTS", "EVAL_SEED_OFFSET", "INSTRUCTION", "KINDS", "OPS", "Observation",
           "Question", "Runner", "StepResult", "ToolEnv", "ToolParams", "combine", "draw_digit",
           "draw_question", "eval_seed", "extract_boxed", "extract_code", "parse_int", "render_question",
           "train_seed"]

KINDS = ("arithmetic", "chart", "count")
OPS = ("sum", "difference", "product")
CELLS = 4  # the image is a CELLS x CELLS grid of cells: the student's 4x4 image tokens at 64 px
MIN_IMAGE = 32  # below 8 px a cell, the seven-segment strokes and the scene's shapes stop being legible
FACTORS = (11, 99)  # the count kind's multiplier range: big enough that the product wants a tool

INSTRUCTION = ("You may run python code in a ```python``` block; its output comes back to you. "
               "Give the final answer as \\boxed{N}.")

INK = (0, 0, 0)
PAPER = (255, 255, 255)

# Segments: a top, b upper right, c lower right, d bottom, e lower left, f upper left, g middle.
DIGIT_SEGMENTS = {0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg",
                  5: "acdfg", 6: "acdefg", 7: "abc", 8: "abcdefg", 9: "abcdfg"}

ARITHMETIC_TEXT = {"sum": "Add the two numbers in the image.",
                   "difference": "Subtract the bottom number from the top number in the image.",
                   "product": "Multiply the two numbers in the image."}
PAIR_TEXT = {"sum": "What is the {0} bar's value plus the {1} bar's value?",
             "difference": "What is the {0} bar's value minus the {1} bar's value?",
             "product": "What is the {0} bar's value times the {1} bar's value?"}
ALL_TEXT = {"sum": "What is the sum of all the bars' values?",
            "product": "What is the product of all the bars' values?"}
COUNT_TEXT = "How many shapes are in the image, multiplied by {0}?"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclass(frozen=True)
class ToolParams:
    image_size: int = 64
    max_tool_calls: int = 2
    kinds: tuple[str, ...] = KINDS
    correct_reward: float = 1.0
    format_penalty: float = -0.1      # a turn with neither a code block nor a boxed answer (or over budget)
    no_tool_penalty: float = -0.1     # added to the final answer's reward when no tool call came before it
    tool_error_penalty: float = 0.0   # the code raised, exited non-zero or hit a sandbox limit (GTPO: none)
    tool_output_chars: int = 200      # the tool turn's text is cut to this (the student's context is short)

    def __post_init__(self) -> None:
        for name in ("image_size", "max_tool_calls", "tool_output_chars"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"ToolParams.{name} must be an int, got {value!r}")
        if self.image_size % CELLS or self.image_size < MIN_IMAGE:
            raise ValueError(f"ToolParams.image_size must be a multiple of {CELLS} and >= {MIN_IMAGE} "
                             f"(whole cells of >= {MIN_IMAGE // CELLS} px), got {self.image_size}")
        if self.max_tool_calls < 0:
            raise ValueError(f"ToolParams.max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if self.tool_output_chars < 1:
            raise ValueError(f"ToolParams.tool_output_chars must be >= 1, got {self.tool_output_chars}")
        kinds = self.kinds
        # a bare string would iterate as letters, and a list would make the frozen params unhashable
        if isinstance(kinds, str) or not isinstance(kinds, (tuple, list)):
            raise ValueError(f"ToolParams.kinds must be a tuple of kind names from {KINDS}, got {kinds!r}")
        kinds = tuple(kinds)
        if not kinds:
            raise ValueError(f"ToolParams.kinds must name at least one of {KINDS}")
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"ToolParams.kinds has unknown kinds {unknown}; expected some of {KINDS}")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"ToolParams.kinds must not repeat a kind, got {kinds}")
        object.__setattr__(self, "kinds", kinds)
        for name in ("correct_reward", "format_penalty", "no_tool_penalty", "tool_error_penalty"):
            value = getattr(self, name)
            if not _is_number(value):
                raise ValueError(f"ToolParams.{name} must be a finite number, got {value!r}")

    @property
    def cell_px(self) -> int:
        return self.image_size // CELLS


@dataclass(frozen=True)
class Question:
    """One drawn question: everything `render_question` and the solver need. `operands` are the integers
    the answer combines, in order (the bottom number, the second named bar or the factor last)."""
    kind: str
    op: str                                   # "sum" | "difference" | "product"
    text: str
    operands: tuple[int, ...]
    numbers: tuple[int, int] | None = None    # arithmetic: (top, bottom)
    bars: dict[str, int] | None = None        # chart: colour -> value, left to right
    named: tuple[str, ...] = ()               # chart: the two bars asked about; () = all bars
    scene: Scene | None = None                # count
    factor: int | None = None                 # count

    @property
    def answer(self) -> int:
        return combine(self.op, self.operands)


def combine(op: str, operands: tuple[int, ...] | list[int]) -> int:
    if not operands:
        raise ValueError("combine needs at least one operand")
    if op == "sum":
        return sum(operands)
    if op == "product":
        return math.prod(operands)
    if op == "difference":
        return operands[0] - sum(operands[1:])
    raise ValueError(f"unknown op {op!r}; expected one of {OPS}")


def draw_question(params: ToolParams, seed: int) -> Question:
    """The question for `seed`, from `random.Random(seed)` alone: the kind, then its contents."""
    if not _is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    kind = rng.choice(params.kinds)
    if kind == "arithmetic":
        top, bottom = rng.randint(10, 99), rng.randint(10, 99)
        op = rng.choice(OPS)
        return Question(kind, op, ARITHMETIC_TEXT[op], (top, bottom), numbers=(top, bottom))
    if kind == "chart":
        colours = list(BAR_COLOURS)
        rng.shuffle(colours)  # the colour, not the position, names a bar
        bars = random_bars(rng, tuple(colours))
        if rng.random() < 0.25:
            op = rng.choice(tuple(ALL_TEXT))
            return Question(kind, op, ALL_TEXT[op], tuple(bars.values()), bars=bars)
        first, second = rng.sample(colours, 2)
        op = rng.choice(OPS)
        return Question(kind, op, PAIR_TEXT[op].format(first, second), (bars[first], bars[second]),
                        bars=bars, named=(first, second))
    scene = random_scene(rng, params.image_size)
    factor = rng.randint(*FACTORS)
    return Question(kind, "product", COUNT_TEXT.format(factor), (scene.count, factor), scene=scene,
                    factor=factor)


def _segment_boxes(cell: int) -> dict[str, tuple[int, int, int, int]]:
    """Each segment's filled rectangle [x0, y0, x1, y1] (inclusive) within a `cell`-px square; strokes
    about 3/16 of the cell thick, so at 16 px a glyph is 10 x 14 px of 3 px strokes."""
    t = max(2, round(cell * 3 / 16))
    x0, x1 = cell * 3 // 16, cell - 1 - cell * 3 // 16
    y0, y1 = max(1, cell // 16), cell - 1 - max(1, cell // 16)
    m0 = (y0 + y1 + 1) // 2 - t // 2  # the middle stroke's top row
    m1 = m0 + t - 1
    return {"a": (x0, y0, x1, y0 + t - 1), "d": (x0, y1 - t + 1, x1, y1), "g": (x0, m0, x1, m1),
            "f": (x0, y0, x0 + t - 1, m1), "b": (x1 - t + 1, y0, x1, m1),
            "e": (x0, m0, x0 + t - 1, y1), "c": (x1 - t + 1, m0, x1, y1)}


def draw_digit(draw: ImageDraw.ImageDraw, digit: int, x: int, y: int, cell: int) -> None:
    """A seven-segment `digit` filling the `cell`-px square whose top-left corner is (x, y)."""
    if digit not in DIGIT_SEGMENTS:
        raise ValueError(f"digit must be an int 0..9, got {digit!r}")
    boxes = _segment_boxes(cell)
    for seg in DIGIT_SEGMENTS[digit]:
        bx0, by0, bx1, by1 = boxes[seg]
        draw.rectangle([x + bx0, y + by0, x + bx1, y + by1], fill=INK)


def render_question(question: Question, image_size: int) -> Image.Image:
    """The question's image, RGB: a pure function of (question, image_size)."""
    if question.kind == "chart":
        assert question.bars is not None
        return draw_bars(question.bars, image_size)
    if question.kind == "count":
        assert question.scene is not None
        return draw_scene(question.scene, image_size)
    assert question.numbers is not None
    cell = image_size // CELLS
    img = Image.new("RGB", (image_size, image_size), PAPER)
    draw = ImageDraw.Draw(img)
    for row, number in zip((0, 2), question.numbers):
        for col, ch in enumerate(str(number)):
            draw_digit(draw, int(ch), col * cell, row * cell, cell)
    return img


# An opening fence: ``` then an optional language tag, then the end of that line; the block runs to the
# next ```.
_FENCE_OPEN = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\r?\n")
_PYTHON_TAGS = ("", "python", "py", "python3")


def extract_code(text: str) -> str | None:
    """The code of the first closed python code block in `text` (```python ... ``` or an untagged
    ``` ... ```; a block in another language is skipped), without the fences and the newline before
    the closing fence; None when there is none (an unclosed block does not count)."""
    pos = 0
    while (opening := _FENCE_OPEN.search(text, pos)) is not None:
        end = text.find("```", opening.end())
        if end < 0:
            return None
        if opening.group(1).lower() in _PYTHON_TAGS:
            code = text[opening.end():end]
            return code[:-1] if code.endswith("\n") else code
        pos = end + 3
    return None


_BOXED = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """The contents of the last complete \\boxed{...} in `text` (braces inside are balanced), stripped;
    None when there is none."""
    found = None
    pos = 0
    while (start := text.find(_BOXED, pos)) >= 0:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found = text[start + len(_BOXED):i - 1].strip()
        pos = start + len(_BOXED)
    return found


_INT = re.compile(r"([+-]?)\s*(\d{1,3}(?:,\d{3})+|\d+)(?:\.0+)?")


def parse_int(answer: str | None) -> int | None:
    """An integer answer: optional sign (spaces after it allowed), digits (thousands commas allowed as
    in 1,786), optional trailing .0; surrounding spaces ignored. None otherwise."""
    if answer is None:
        return None
    match = _INT.fullmatch(answer.strip())
    if match is None:
        return None
    value = int(match.group(2).replace(",", ""))
    return -value if match.group(1) == "-" else value


@dataclass
class Observation:
    image: Image.Image | None
    text: str
    role: str = "user"  # "tool" for a code run's output


@dataclass
class StepResult:
    observation: Observation | None  # None once done
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class Runner(Protocol):
    """What ToolEnv needs of a sandbox (protege.tools.sandbox.Sandbox): `.run(code) -> Outcome` with
    `.error`, `.limit`, `.ms` and `.tool_text(max_chars)`."""

    def run(self, code: str) -> Any: ...


class ToolEnv:
    """One question at a time; `reset(seed)` starts one, `step(text)` plays a turn. `sandbox` runs the
    model's code; None builds protege.tools.sandbox.Sandbox() at the first code run."""

    def __init__(self, params: ToolParams = ToolParams(), sandbox: Runner | None = None) -> None:
        if not isinstance(params, ToolParams):
            raise ValueError(f"params must be a ToolParams, got {type(params).__name__}")
        if sandbox is not None and not callable(getattr(sandbox, "run", None)):
            raise ValueError(f"sandbox must have a run(code) method, got {type(sandbox).__name__}")
        self.params = params
        self._sandbox = sandbox
        self._question: Question | None = None
        self._image: Image.Image | None = None
        self._seed: int | None = None
        self._obs: Observation | None = None
        self._turn = 0
        self._tool_calls = 0
        self._done = False
        self._success = False

    @property
    def sandbox(self) -> Runner:
        if self._sandbox is None:
            # imported late: the sandbox is only needed once the model writes code
            from protege.tools.sandbox import Sandbox
            self._sandbox = Sandbox()
        return self._sandbox

    def reset(self, seed: int) -> Observation:
        question = draw_question(self.params, seed)
        self._question, self._seed = question, seed
        self._image = render_question(question, self.params.image_size)
        self._turn, self._tool_calls, self._done, self._success = 0, 0, False, False
        self._obs = Observation(self._image, f"{question.text} {INSTRUCTION}")
        return self._obs

    def observation(self) -> Observation:
        """The observation the next turn answers: the question, or the last tool output."""
        if self._done:
            raise RuntimeError("the episode is over: no observation follows its last turn")
        if self._obs is None:
            raise RuntimeError("no episode yet: call reset(seed) first")
        return self._obs

    def step(self, text: str) -> StepResult:
        question = self.state
        if self._done:
            raise RuntimeError(f"the episode is over (turn {self._turn}, success={self._success}); "
                               f"call reset(seed) before stepping again")
        p = self.params
        self._turn += 1
        code = extract_code(text)
        boxed = extract_boxed(text) if code is None else None
        value = parse_int(boxed)
        info = {"turn": self._turn, "tool_call": False, "runtime_error": False, "code": code or "",
                "legal": True, "parsed": False, "answer": boxed, "success": False, "kind": question.kind,
                "limit": None, "tool_ms": 0.0}
        if code is not None and self._tool_calls < p.max_tool_calls:
            outcome = self.sandbox.run(code)
            self._tool_calls += 1
            error = bool(outcome.error)
            info.update(tool_call=True, runtime_error=error, parsed=True, limit=outcome.limit or None,
                        tool_ms=float(outcome.ms))
            self._obs = Observation(None, outcome.tool_text(p.tool_output_chars), role="tool")
            return StepResult(self._obs, float(p.tool_error_penalty if error else 0.0), False, info)
        if code is None and boxed is not None:
            self._success = value is not None and value == question.answer
            info.update(parsed=value is not None, success=self._success)
            reward = p.correct_reward if self._success else 0.0
            if self._tool_calls == 0 and p.max_tool_calls > 0:  # answered without the tool it was given
                reward += p.no_tool_penalty
        else:  # no code and no answer, or code past the tool budget
            info.update(legal=False)
            reward = p.format_penalty
        self._done = True
        self._obs = None
        return StepResult(None, float(reward), True, info)

    @property
    def state(self) -> Question:
        """The current question with what its image shows (numbers, bars or scene)."""
        if self._question is None:
            raise RuntimeError("no episode yet: call reset(seed) first")
        return self._question

    @property
    def question(self) -> str:
        """The question's text (without the instruction)."""
        return self.state.text

    @property
    def answer(self) -> int:
        return self.state.answer

    @property
    def kind(self) -> str:
        return self.state.kind

    @property
    def image(self) -> Image.Image:
        if self._image is None:
            raise RuntimeError("no episode yet: call reset(seed) first")
        return self._image

    @property
    def seed(self) -> int | None:
        return self._seed

    @property
    def turn(self) -> int:
        """Turns played in this episode (0 right after reset)."""
        return self._turn

    @property
    def tool_calls(self) -> int:
        """Code blocks run in this episode."""
        return self._tool_calls

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool:
        return self._success
