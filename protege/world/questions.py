"""Question kinds of the embedded world, asked in the formats the 14 benchmarks use.

Every item carries its full candidate set, so chance level is known exactly (1 / candidates), and
is built around a target answer handed in by the caller: the generator deals targets from a shuffled
deck per kind, so every answer (and every option letter) is equally frequent within a split.

A question's text is rendered by the evaluation's own prompt builder (`protege.bench.prompts`) in the
style of one benchmark family (option lists with letters and "answer with the option's letter"
instructions, MMBench hints, MMBench-CN's Chinese wording, MMStar's inline options, BLINK's
two-image questions, short-answer and integer instructions), so the student learns the formats it is
evaluated in, never the mini benchmarks' own questions or images.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from PIL import Image

from protege.bench.items import BenchItem
from protege.bench.prompts import build_prompt
from protege.world.scenes import (
    BAR_COLOURS,
    COLOURS,
    MAX_BAR,
    MAX_COUNT,
    SHAPES,
    SHAPES_CN,
    draw_bars,
    draw_scene,
    random_bars,
    random_scene,
)

LETTERS = "ABCD"
YES_NO = ["Yes", "No"]
COUNTS = [str(i) for i in range(1, MAX_COUNT + 1)]
BARS = [str(i) for i in range(1, MAX_BAR + 1)]
# hints in MMBench's style; the mini benchmarks use other sentences
HINTS_EN = ["Look at the picture carefully.", "The picture shows simple shapes on a white background."]
HINTS_CN = ["请仔细观察图片。", "图片中是白色背景上的简单图形。"]
# benchmark families whose prompt format each kind is asked in
MC_FAMILIES = ("ai2d", "seedbench", "mmstar", "mmbench", "mmbench_cn", "mmmu", "realworldqa")
OPEN_FAMILIES = ("chartqa", "mmmu", "mathvista", "realworldqa", "mmvet")


@dataclass
class Item:
    kind: str
    question: str                    # the full user turn, as the student sees it
    answer: str
    candidates: list[str]
    images: list[Image.Image]
    options: list[str] = field(default_factory=list)  # option texts for multiple-choice items
    difficulty: int = 1
    family: str = ""                 # the benchmark whose prompt format this question uses
    # what the image shows that the question is about, for the scripted teachers' accounts (never shown to the
    # student): "scene" (shape, colour, count), "scenes" (two of them), "bars" + "bar", "options" (English
    # option texts, A, B, ... in order) and, for yes / no, "asked" (the colour and / or shape asked about)
    facts: dict = field(default_factory=dict)


def _mc_prompt(rng: random.Random, family: str, question: str, question_cn: str, options: list[str]) -> str:
    opts = dict(zip(LETTERS, options))
    if family == "realworldqa":
        lines = "\n".join(f"{k}. {v}" for k, v in opts.items())
        question = (f"{question}\n{lines}\nPlease answer directly with only the letter of the correct option "
                    "and nothing else.")
    item = BenchItem(benchmark=family, index="0", question=question_cn if family == "mmbench_cn" else question,
                     images=[], answer="", options=opts)
    if family in ("mmbench", "mmbench_cn"):
        item.hint = rng.choice(["", *(HINTS_CN if family == "mmbench_cn" else HINTS_EN)])
    return build_prompt(item)


def _open_prompt(family: str, question: str, integer: bool) -> str:
    if family == "realworldqa":
        return f"{question}\nPlease answer directly with a single word or number."
    if family == "mathvista" and integer:
        meta = {"question_type": "free_form", "answer_type": "integer"}
        return build_prompt(BenchItem("mathvista", "0", question, [], "", meta=meta))
    if family == "mathvista":  # a text answer: MathVista asks those as multiple choice; use the short form
        family = "chartqa"
    return build_prompt(BenchItem(family, "0", question, [], ""))


def _options_with(rng: random.Random, gold_letter: str, correct: str, pool: list[str]) -> list[str]:
    """Four option texts with `correct` at `gold_letter`, the others drawn from the pool."""
    others = rng.sample([p for p in pool if p != correct], len(LETTERS) - 1)
    pos = LETTERS.index(gold_letter)
    return others[:pos] + [correct] + others[pos:]


def _ordered_options(rng: random.Random, gold_letter: str, pool: list[str]) -> tuple[list[str], str]:
    """Four options in the pool's own order (shapes as listed, numbers ascending) with the correct one at
    `gold_letter`: (options, the correct option's text). Listing options in a fixed order is the easy
    form of a multiple-choice question; shuffled options make the student read the list."""
    pos = LETTERS.index(gold_letter)
    n_after = len(LETTERS) - 1 - pos
    j = rng.randint(pos, len(pool) - 1 - n_after)
    before = sorted(rng.sample(range(j), pos))
    after = sorted(rng.sample(range(j + 1, len(pool)), n_after))
    return [pool[i] for i in (*before, j, *after)], pool[j]


def _seen(scene) -> dict:
    """A homogeneous scene's facts: its shape, colour and count."""
    return {"shape": scene.shape, "colour": scene.colour, "count": scene.count}


def _mc_options(rng: random.Random, gold_letter: str, pool: list[str]) -> tuple[list[str], str, int]:
    """Options, the correct text and the difficulty: half in the pool's order (1), half shuffled (2)."""
    if rng.random() < 0.5:
        options, correct = _ordered_options(rng, gold_letter, pool)
        return options, correct, 1
    correct = rng.choice(pool)
    return _options_with(rng, gold_letter, correct, pool), correct, 2


def count(rng: random.Random, size: int, target: str, pick) -> Item:
    scene = random_scene(rng, size, count=int(target))
    q = rng.choice(["How many shapes are in the image?", "How many shapes are there?",
                    "Count the shapes in the picture."])
    family = pick(OPEN_FAMILIES)
    return Item("count", _open_prompt(family, q, integer=True), target, COUNTS, [draw_scene(scene, size)],
                difficulty=2, family=family, facts={"scene": _seen(scene)})


def colour(rng: random.Random, size: int, target: str, pick) -> Item:
    scene = random_scene(rng, size, colour=target)
    q = rng.choice(["What colour are the shapes?", "Which colour do the shapes have?"])
    family = pick(OPEN_FAMILIES)
    return Item("colour", _open_prompt(family, q, integer=False), target, list(COLOURS),
                [draw_scene(scene, size)], difficulty=1, family=family, facts={"scene": _seen(scene)})


def shape(rng: random.Random, size: int, target: str, pick) -> Item:
    scene = random_scene(rng, size, shape=target)
    q = rng.choice(["What shape are the objects in the image?", "Which shape do you see?"])
    family = pick(OPEN_FAMILIES)
    return Item("shape", _open_prompt(family, q, integer=False), target, list(SHAPES), [draw_scene(scene, size)],
                difficulty=1, family=family, facts={"scene": _seen(scene)})


def shape_option(rng: random.Random, size: int, target: str, pick) -> Item:
    options, correct, difficulty = _mc_options(rng, target, list(SHAPES))
    scene = random_scene(rng, size, shape=correct)
    family = pick(MC_FAMILIES)
    shown = [SHAPES_CN[o] for o in options] if family == "mmbench_cn" else options
    prompt = _mc_prompt(rng, family, "Which shape is shown in the image?", "图中是哪种图形？", shown)
    return Item("shape_option", prompt, target, list(LETTERS), [draw_scene(scene, size)], options=shown,
                difficulty=difficulty, family=family, facts={"scene": _seen(scene), "options": options})


def count_option(rng: random.Random, size: int, target: str, pick) -> Item:
    options, correct, difficulty = _mc_options(rng, target, COUNTS)
    scene = random_scene(rng, size, count=int(correct))
    family = pick(MC_FAMILIES)
    prompt = _mc_prompt(rng, family, "How many shapes are in the image?", "图中有几个图形？", options)
    return Item("count_option", prompt, target, list(LETTERS), [draw_scene(scene, size)], options=options,
                difficulty=difficulty + 1, family=family, facts={"scene": _seen(scene), "options": options})


def chart_value(rng: random.Random, size: int, target: str, pick) -> Item:
    bar = rng.choice(BAR_COLOURS)
    values = random_bars(rng)
    values[bar] = int(target)
    family = pick(("chartqa", "mathvista", "realworldqa", "mmmu"))
    prompt = _open_prompt(family, f"What is the value of the {bar} bar?", integer=True)
    image = draw_bars(values, size, shift=rng.randint(-2, 2))
    return Item("chart_value", prompt, target, BARS, [image], difficulty=3, family=family,
                facts={"bars": values, "bar": bar})


def chart_option(rng: random.Random, size: int, target: str, pick) -> Item:
    bar = rng.choice(BAR_COLOURS)
    options, correct, difficulty = _mc_options(rng, target, BARS)
    values = random_bars(rng)
    values[bar] = int(correct)
    family = pick(("seedbench", "ai2d", "mmstar", "mmmu"))
    prompt = _mc_prompt(rng, family, f"What is the value of the {bar} bar in the chart?", "", options)
    image = draw_bars(values, size, shift=rng.randint(-2, 2))
    return Item("chart_option", prompt, target, list(LETTERS), [image], options=options, difficulty=difficulty + 1,
                family=family, facts={"bars": values, "bar": bar, "options": options})


def yes_no(rng: random.Random, size: int, target: str, pick) -> Item:
    """About the colour (difficulty 1), the shape (2), or both at once (3: 'yes' needs both to match, a 'no'
    differs in one of them)."""
    scene = random_scene(rng, size)
    shape, col = scene.shape, scene.colour
    form = rng.choice(("colour", "shape", "both"))
    if target == "No":
        if form == "shape" or (form == "both" and rng.random() < 0.5):
            shape = rng.choice([s for s in SHAPES if s != shape])
        else:
            col = rng.choice([c for c in COLOURS if c != col])
    asked = {"colour": col} if form == "colour" else {"shape": shape} if form == "shape" else \
        {"colour": col, "shape": shape}
    if form == "colour":
        q, difficulty = rng.choice([f"Are the shapes {col}?", f"Are all shapes in the image {col}?"]), 1
    elif form == "shape":
        q, difficulty = rng.choice([f"Are the shapes {shape}s?", f"Does the image show {shape}s?"]), 2
    else:
        q, difficulty = rng.choice([f"Are the shapes in the image {col} {shape}s?",
                                    f"Is there a {col} {shape} in the image?"]), 3
    family = pick(("chartqa", "mmmu", "realworldqa"))
    return Item("yes_no", _open_prompt(family, q, integer=False), target, YES_NO, [draw_scene(scene, size)],
                difficulty=difficulty, family=family, facts={"scene": _seen(scene), "asked": asked})


def compare_two(rng: random.Random, size: int, target: str, pick) -> Item:
    """BLINK-style: two images in one question; which shows more shapes."""
    more, fewer = sorted(rng.sample(range(1, MAX_COUNT + 1), 2), reverse=True)
    first, second = (more, fewer) if target == "A" else (fewer, more)
    scenes = [random_scene(rng, size, count=first), random_scene(rng, size, count=second)]
    images = [draw_scene(s, size) for s in scenes]
    opts = {"A": "the first image", "B": "the second image"}
    q = rng.choice(["Which image shows more shapes?", "Which of the two images contains more shapes?"])
    prompt = build_prompt(BenchItem("blink", "0", q, [], "", options=opts))
    return Item("compare_two", prompt, target, ["A", "B"], images, options=list(opts.values()), difficulty=3,
                family="blink", facts={"scenes": [_seen(s) for s in scenes]})


MAKERS = {"count": count, "colour": colour, "shape": shape, "shape_option": shape_option,
          "count_option": count_option, "chart_value": chart_value, "chart_option": chart_option, "yes_no": yes_no,
          "compare_two": compare_two}
KINDS = tuple(MAKERS)
ANSWERS = {"count": COUNTS, "colour": list(COLOURS), "shape": list(SHAPES), "shape_option": list(LETTERS),
           "count_option": list(LETTERS), "chart_value": BARS, "chart_option": list(LETTERS), "yes_no": YES_NO,
           "compare_two": ["A", "B"]}


class Deck:
    """Deals values in shuffled full rounds, so each value's frequency differs by at most one."""

    def __init__(self, rng: random.Random, values: list[str]):
        self.rng, self.values, self.hand = rng, list(values), []

    def deal(self) -> str:
        if not self.hand:
            self.hand = list(self.values)
            self.rng.shuffle(self.hand)
        return self.hand.pop()


def make_item(rng: random.Random, size: int, kind: str | None = None, target: str | None = None,
              held_out: tuple[str, ...] = ()) -> Item:
    """One question of `kind` with answer `target` (each drawn when not given), worded in the format of a
    benchmark family not in `held_out` (a kind asked only in held-out formats keeps them)."""
    kind = kind or rng.choice(KINDS)

    def pick(families: tuple[str, ...]) -> str:
        return rng.choice([f for f in families if f not in held_out] or list(families))

    return MAKERS[kind](rng, size, target or rng.choice(ANSWERS[kind]), pick)
