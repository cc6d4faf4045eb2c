"""Procedural images drawn with Pillow: shape scenes and bar charts."""
from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS_CN = {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色"}  # MMBench-CN's wording
SHAPES_CN = {"circle": "圆形", "square": "正方形", "triangle": "三角形", "diamond": "菱形"}
GRID = 4                      # scenes place shapes on a GRID x GRID lattice of cells (one cell per image token)
MAX_COUNT = 8
BAR_COLOURS = ("red", "green", "blue", "yellow")
MAX_BAR = 6


@dataclass(frozen=True)
class Scene:
    """Shapes on a grid; `shapes[i]` and `colours[i]` describe the shape at `positions[i]`."""
    shapes: tuple[str, ...]
    colours: tuple[str, ...]
    positions: tuple[tuple[int, int], ...]  # centres, in pixels

    @property
    def count(self) -> int:
        return len(self.positions)

    @property
    def shape(self) -> str:
        """The shape kind when all shapes share it (homogeneous scenes), else ''."""
        return self.shapes[0] if len(set(self.shapes)) == 1 else ""

    @property
    def colour(self) -> str:
        return self.colours[0] if len(set(self.colours)) == 1 else ""


def _positions(rng: random.Random, size: int, count: int) -> tuple[tuple[int, int], ...]:
    cell = size // GRID
    cells = rng.sample([(r, c) for r in range(GRID) for c in range(GRID)], count)
    jitter = max(1, cell // 16)
    off = (size - cell * GRID) // 2
    return tuple((off + c * cell + cell // 2 + rng.randint(-jitter, jitter),
                  off + r * cell + cell // 2 + rng.randint(-jitter, jitter)) for r, c in cells)


def random_scene(rng: random.Random, size: int, count: int | None = None, shape: str | None = None,
                 colour: str | None = None) -> Scene:
    """A homogeneous scene: `count` shapes of one kind and one colour (each drawn when not given)."""
    count = count or rng.randint(1, MAX_COUNT)
    shape = shape or rng.choice(SHAPES)
    colour = colour or rng.choice(list(COLOURS))
    return Scene((shape,) * count, (colour,) * count, _positions(rng, size, count))


def mixed_scene(rng: random.Random, size: int, counts: dict[str, int], shape: str | None = None) -> Scene:
    """Shapes of one kind in several colours: counts = colour -> how many."""
    shape = shape or rng.choice(SHAPES)
    colours = [c for c, n in counts.items() for _ in range(n)]
    rng.shuffle(colours)
    return Scene((shape,) * len(colours), tuple(colours), _positions(rng, size, len(colours)))


def draw_scene(scene: Scene, size: int) -> Image.Image:
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    r = max(3, (size // GRID) * 6 // 16)  # 6 px in a 16 px cell: outlines differ, neighbours never touch
    for shape, colour, (x, y) in zip(scene.shapes, scene.colours, scene.positions):
        fill = COLOURS[colour]
        if shape == "circle":
            draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
        elif shape == "square":
            draw.rectangle([x - r, y - r, x + r, y + r], fill=fill)
        elif shape == "triangle":
            draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
        else:  # diamond
            draw.polygon([(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill=fill)
    return img


def random_bars(rng: random.Random, colours: tuple[str, ...] = BAR_COLOURS) -> dict[str, int]:
    return {c: rng.randint(1, MAX_BAR) for c in colours}


def draw_bars(values: dict[str, int], size: int, shift: int = 0) -> Image.Image:
    """Bars left to right in the order of `values`, each unit of value the same height; `shift` moves
    them sideways by that many pixels (the same chart drawn in a few different ways)."""
    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    base = size - 4
    unit = (size - 8) // MAX_BAR
    column = size // len(values)  # with as many bars as image-token columns, each bar fills its own column
    width = column // 2
    draw.line([(2, base), (size - 2, base)], fill=(0, 0, 0))
    for i, (colour, value) in enumerate(values.items()):
        x0 = i * column + (column - width) // 2 + shift
        draw.rectangle([x0, base - value * unit, x0 + width - 1, base - 1], fill=COLOURS[colour])
    return img
