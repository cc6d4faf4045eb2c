"""Question kinds of the embedded world, each with a short reference answer and its candidates.

Every item carries the full candidate set so that chance level is known exactly (1 / candidates).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from PIL import Image

from protege.world.scenes import (BAR_COLOURS, COLOURS, MAX_BAR, MAX_COUNT, SHAPES, draw_bars, draw_scene,
                                  random_bars, random_scene)

KINDS = ("count", "colour", "shape_option", "chart_value")
LETTERS = "ABCD"


@dataclass
class Item:
    kind: str
    question: str
    answer: str
    candidates: list[str]
    image: Image.Image
    options: list[str] = field(default_factory=list)  # option texts for multiple-choice items
    difficulty: int = 1


def _count(rng: random.Random, size: int) -> Item:
    scene = random_scene(rng, size)
    q = rng.choice(["How many shapes are in the image?", "How many shapes are there?",
                    "Count the shapes in the picture."])
    return Item("count", q, str(scene.count), [str(i) for i in range(1, MAX_COUNT + 1)],
                draw_scene(scene, size), difficulty=1)


def _colour(rng: random.Random, size: int) -> Item:
    scene = random_scene(rng, size)
    q = rng.choice(["What colour are the shapes?", "Which colour do the shapes have?"])
    return Item("colour", q, scene.colour, list(COLOURS), draw_scene(scene, size), difficulty=1)


def _shape_option(rng: random.Random, size: int) -> Item:
    scene = random_scene(rng, size)
    options = list(SHAPES)
    rng.shuffle(options)
    letters = LETTERS[: len(options)]
    lines = "\n".join(f"{letter}. {opt}" for letter, opt in zip(letters, options))
    q = f"Which shape is shown?\n{lines}\nAnswer with the option letter."
    answer = letters[options.index(scene.shape)]
    return Item("shape_option", q, answer, list(letters), draw_scene(scene, size), options=options,
                difficulty=2)


def _chart_value(rng: random.Random, size: int) -> Item:
    values = random_bars(rng)
    colour = rng.choice(BAR_COLOURS)
    q = f"What is the value of the {colour} bar?"
    return Item("chart_value", q, str(values[colour]), [str(i) for i in range(1, MAX_BAR + 1)],
                draw_bars(values, size), difficulty=3)


MAKERS = {"count": _count, "colour": _colour, "shape_option": _shape_option, "chart_value": _chart_value}


def make_item(rng: random.Random, size: int, kind: str | None = None) -> Item:
    return MAKERS[kind or rng.choice(KINDS)](rng, size)
