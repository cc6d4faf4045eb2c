"""Procedural images drawn with Pillow: shape scenes and bar charts."""
from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle")
MAX_COUNT = 4
BAR_COLOURS = ("red", "green", "blue")
MAX_BAR = 5


@dataclass(frozen=True)
class Scene:
    shape: str
    colour: str
    count: int
    positions: tuple[tuple[int, int], ...]  # centres, in pixels


def random_scene(rng: random.Random, size: int) -> Scene:
    count = rng.randint(1, MAX_COUNT)
    cell = size // 2
    cells = rng.sample([(0, 0), (0, 1), (1, 0), (1, 1)], count)  # one shape per quadrant: never overlap
    jitter = max(1, cell // 8)
    positions = tuple(
        (c * cell + cell // 2 + rng.randint(-jitter, jitter), r * cell + cell // 2 + rng.randint(-jitter, jitter))
        for r, c in cells)
    return Scene(rng.choice(SHAPES), rng.choice(list(COLOURS)), count, positions)


def draw_scene(scene: Scene, size: int) -> Image.Image:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    r = max(3, size // 8)
    fill = COLOURS[scene.colour]
    for x, y in scene.positions:
        if scene.shape == "circle":
            draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
        elif scene.shape == "square":
            draw.rectangle([x - r, y - r, x + r, y + r], fill=fill)
        else:
            draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    return img


def random_bars(rng: random.Random) -> dict[str, int]:
    return {c: rng.randint(1, MAX_BAR) for c in BAR_COLOURS}


def draw_bars(values: dict[str, int], size: int) -> Image.Image:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    base = size - 4
    unit = (size - 8) // MAX_BAR
    width = size // (2 * len(values))
    draw.line([(2, base), (size - 2, base)], fill=(0, 0, 0))
    for i, (colour, value) in enumerate(values.items()):
        x0 = 4 + i * 2 * width + width // 2
        draw.rectangle([x0, base - value * unit, x0 + width, base - 1], fill=COLOURS[colour])
    return img
