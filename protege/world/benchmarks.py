"""Mini versions of the 14 RIL benchmarks, drawn from the embedded world.

Each mini benchmark asks world questions (shapes, colours, counts, bar charts) the way the real one
asks: the same answer format (option letters, free-form numbers, relaxed-accuracy chart values,
judge-scored free text), the same quirks (MMBench circular copies, Chinese for MMBench-CN, several
images for BLINK and MM-Vet-v2, up to ten options for MMMU-Pro, options inside the question text for
RealWorldQA) and, by `FORMATS`, the same file layout as its usual distribution. Images come from
seed streams of their own and any image already in the world's splits is drawn again, so nothing
here was seen in training.
"""
from __future__ import annotations

import hashlib
import io
import random
from collections.abc import Callable

from PIL import Image

from protege.bench.items import BENCHMARKS, BenchItem
from protege.world.scenes import (
    COLOURS,
    COLOURS_CN,
    MAX_BAR,
    MAX_COUNT,
    SHAPES,
    SHAPES_CN,
    Scene,
    draw_bars,
    draw_scene,
    random_scene,
)

# the layout each mini benchmark is written in: VLMEvalKit TSV, lmms-eval parquet, or MM-Vet JSON
FORMATS = {"ai2d": "tsv", "chartqa": "parquet", "mathvista": "parquet", "mmbench": "tsv", "mmbench_cn": "tsv",
           "mmvet": "json", "mmvet_v2": "json", "mmmu": "parquet", "mmmu_pro": "parquet", "mmstar": "tsv",
           "blink": "parquet", "seedbench": "parquet", "seedbench2_plus": "tsv", "realworldqa": "tsv"}
SUFFIX = {"tsv": ".tsv", "parquet": ".parquet", "json": ".json"}
LETTERS = "ABCDEFGHIJ"


class Draw:
    """Images for one benchmark: scenes and charts whose PNG is not in `avoid` (the world's images)."""

    def __init__(self, rng: random.Random, size: int, avoid: set[str]):
        self.rng, self.size, self.avoid = rng, size, avoid

    def _fresh(self, make: Callable[[], tuple[object, Image.Image]]) -> tuple[object, bytes]:
        for _ in range(1000):
            what, image = make()
            buf = io.BytesIO()
            image.save(buf, format="PNG")
            png = buf.getvalue()
            digest = hashlib.sha256(png).hexdigest()
            if digest not in self.avoid:
                self.avoid.add(digest)
                return what, png
        raise ValueError("world: cannot draw an image for the mini benchmarks that is not in the world's splits")

    def scene(self) -> tuple[Scene, bytes]:
        def make():
            s = random_scene(self.rng, self.size)
            return s, draw_scene(s, self.size)
        return self._fresh(make)

    def bars(self) -> tuple[dict[str, int], bytes]:
        """Four bars: the world's charts have three, and all 125 of those are in its splits."""
        def make():
            v = {c: self.rng.randint(1, MAX_BAR) for c in COLOURS}
            return v, draw_bars(v, self.size)
        return self._fresh(make)


def options(rng: random.Random, correct: str, pool: list[str], n: int) -> tuple[dict[str, str], str]:
    """n shuffled options containing `correct`, as letter -> text, and the gold letter."""
    texts = [correct] + rng.sample([p for p in pool if p != correct], n - 1)
    rng.shuffle(texts)
    opts = dict(zip(LETTERS, texts))
    return opts, LETTERS[texts.index(correct)]


def _counts(exclude: str = "") -> list[str]:
    return [str(i) for i in range(1, MAX_COUNT + 3) if str(i) != exclude]


def _scene_mc(rng: random.Random, draw: Draw, n_options: int = 4, chinese: bool = False
              ) -> tuple[str, dict[str, str], str, list[bytes], str]:
    """A shape/colour/count multiple-choice question: (question, options, gold letter, images, category)."""
    scene, png = draw.scene()
    kind = rng.choice(["count", "colour", "shape"])
    if kind == "count":
        q = "图中有几个图形？" if chinese else "How many shapes are in the image?"
        opts, gold = options(rng, str(scene.count), _counts(), n_options)
        return q, opts, gold, [png], "counting"
    if kind == "colour":
        names = COLOURS_CN if chinese else {c: c for c in COLOURS}
        q = "图中的图形是什么颜色？" if chinese else "What colour are the shapes?"
        opts, gold = options(rng, names[scene.colour], list(names.values()), min(n_options, len(names)))
        return q, opts, gold, [png], "colour recognition"
    names = SHAPES_CN if chinese else {s: s for s in SHAPES}
    q = "图中是哪种图形？" if chinese else "Which shape is shown in the image?"
    opts, gold = options(rng, names[scene.shape], list(names.values()), min(n_options, len(names)))
    return q, opts, gold, [png], "shape recognition"


def _item(name: str, i: int, **kw) -> BenchItem:
    return BenchItem(benchmark=name, index=str(kw.pop("index", i)), **kw)


def make_mc_benchmark(name: str, rng: random.Random, draw: Draw, n: int, **mc_kw) -> list[BenchItem]:
    items = []
    for i in range(n):
        q, opts, gold, ims, cat = _scene_mc(rng, draw, **mc_kw)
        items.append(_item(name, i, question=q, images=ims, answer=gold, options=opts, category=cat))
    return items


def make_mmbench(name: str, rng: random.Random, draw: Draw, n_questions: int) -> list[BenchItem]:
    """Circular copies: copy k rotates the options k places and has index base + k * 1_000_000."""
    chinese = name == "mmbench_cn"
    items = []
    for i in range(n_questions):
        q, opts, gold, ims, cat = _scene_mc(rng, draw, n_options=4, chinese=chinese)
        texts, correct = list(opts.values()), opts[gold]
        hint = rng.choice(["", "图中只有一种图形。" if chinese else "All shapes in the image look alike."])
        for k in range(len(texts)):
            rot = texts[k:] + texts[:k]
            rot_opts = dict(zip(LETTERS, rot))
            items.append(_item(name, i, index=i + k * 1_000_000, question=q, images=ims, hint=hint,
                               answer=LETTERS[rot.index(correct)], options=rot_opts, category=cat,
                               l2_category="perception", group=str(i)))
    return items


def make_chartqa(rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    items = []
    for i in range(n):
        values, png = draw.bars()
        a, b = rng.sample(list(values), 2)
        kind = rng.choice(["value", "sum", "share"])
        if kind == "value":
            q, ans = f"What is the value of the {a} bar?", str(values[a])
        elif kind == "sum":
            q, ans = f"What is the sum of the {a} and {b} bars?", str(values[a] + values[b])
        else:
            share = 100 * values[a] / sum(values.values())
            q, ans = f"What percentage of the total do the {a} bar's values make up?", f"{share:.1f}"
        items.append(_item("chartqa", i, question=q, images=[png], answer=ans,
                           category=rng.choice(["human_test", "augmented_test"]), meta={"type": kind}))
    return items


def make_mathvista(rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    items = []
    for i in range(n):
        pid = str(i + 1)
        kind = i % 3
        if kind == 0:
            scene, png = draw.scene()
            q = "How many shapes are in the figure?"
            meta = {"question_type": "free_form", "answer_type": "integer", "precision": None, "choices": None,
                    "unit": None}
            items.append(_item("mathvista", i, index=pid, question=q, images=[png], answer=str(scene.count),
                               category="math-targeted-vqa", meta={**meta, "skills": ["arithmetic reasoning"]}))
        elif kind == 1:
            values, png = draw.bars()
            mean = sum(values.values()) / len(values)
            q = "What is the average value of the bars? (Round to one decimal place)"
            meta = {"question_type": "free_form", "answer_type": "float", "precision": 1, "choices": None,
                    "unit": None}
            items.append(_item("mathvista", i, index=pid, question=q, images=[png], answer=f"{mean:.1f}",
                               category="general-vqa", meta={**meta, "skills": ["statistical reasoning"]}))
        else:
            values, png = draw.bars()
            tallest = max(values, key=values.get)
            if list(values.values()).count(values[tallest]) > 1:
                q, correct = "Is any bar taller than all the others?", "No"
                choices = ["Yes", "No"]
            else:
                q, correct = "Which bar is the tallest?", tallest
                choices = list(values)
            opts = dict(zip(LETTERS, choices))
            meta = {"question_type": "multi_choice", "answer_type": "text", "precision": None, "choices": choices,
                    "unit": None, "skills": ["logical reasoning"]}
            items.append(_item("mathvista", i, index=pid, question=q, images=[png], answer=correct, options=opts,
                               category="figure question answering", meta=meta))
    return items


def make_mmvet(name: str, rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    items = []
    for i in range(n):
        if name == "mmvet_v2" and i % 2 == 0:
            (s1, p1), (s2, p2) = draw.scene(), draw.scene()
            q = "<image><image>How many shapes are there in the two images together?"  # image slots, in order
            items.append(_item(name, i, index=f"v2_{i}", question=q, images=[p1, p2], answer=str(s1.count + s2.count),
                               category="rec,math", meta={"capability": ["rec", "math"]}))
            continue
        scene, png = draw.scene()
        plural = "s" if scene.count > 1 else ""
        q = rng.choice(["What colour are the shapes, and how many are there?", "Describe the shapes in the image."])
        answer = (f"{scene.colour} <AND> {scene.count}" if q.startswith("What")
                  else f"{scene.count} {scene.colour} {scene.shape}{plural}")
        prefix = "v2" if name == "mmvet_v2" else "v1"
        question = f"<image>{q}" if name == "mmvet_v2" else q
        items.append(_item(name, i, index=f"{prefix}_{i}", question=question, images=[png], answer=answer,
                           category="rec,math", meta={"capability": ["rec", "math"]}))
    return items


def make_mmmu(name: str, rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    items = []
    for i in range(n):
        scene, png = draw.scene()
        subject = rng.choice(["Math", "Art", "Design"])
        idx = f"validation_{subject}_{i + 1}"
        if name == "mmmu" and i % 3 == 2:
            q = "<image 1> How many shapes are shown?"
            items.append(_item(name, i, index=idx, question=q, images=[png], answer=str(scene.count),
                               category=subject, difficulty=rng.choice(["Easy", "Medium", "Hard"]),
                               meta={"question_type": "open"}))
            continue
        n_opts = 10 if name == "mmmu_pro" else 4
        pool = [str(k) for k in range(1, 11)]
        q = "How many shapes are in <image 1>?"
        opts, gold = options(rng, str(scene.count), pool, n_opts)
        items.append(_item(name, i, index=idx, question=q, images=[png], answer=gold, options=opts,
                           category=subject, difficulty="" if name == "mmmu_pro" else
                           rng.choice(["Easy", "Medium", "Hard"]), meta={"question_type": "multiple-choice"}))
    return items


def make_blink(rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    items = []
    for i in range(n):
        (s1, p1), (s2, p2) = draw.scene(), draw.scene()
        while s1.count == s2.count:
            s2, p2 = draw.scene()
        q = "Which image shows more shapes?"
        opts = {"A": "the first image", "B": "the second image"}
        items.append(_item("blink", i, index=f"val_Counting_{i + 1}", question=q, images=[p1, p2],
                           answer="A" if s1.count > s2.count else "B", options=opts, category="Counting"))
    return items


def make_seedbench2_plus(rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    items = []
    for i in range(n):
        values, png = draw.bars()
        colour = rng.choice(list(values))
        opts, gold = options(rng, str(values[colour]), [str(k) for k in range(1, MAX_BAR + 1)], 4)
        items.append(_item("seedbench2_plus", i, question=f"What is the value of the {colour} bar in the chart?",
                           images=[png], answer=gold, options=opts, category="chart"))
    return items


def make_realworldqa(rng: random.Random, draw: Draw, n: int) -> list[BenchItem]:
    """Options live in the question text, as in RealWorldQA; some questions are open (a number)."""
    items = []
    for i in range(n):
        scene, png = draw.scene()
        if i % 2:
            q = ("How many shapes are there?\nPlease answer directly with a single word or number.")
            items.append(_item("realworldqa", i, question=q, images=[png], answer=str(scene.count)))
            continue
        opts, gold = options(rng, scene.shape, list(SHAPES), 3)
        lines = "\n".join(f"{k}. {v}" for k, v in opts.items())
        q = (f"Which shape is in the image?\n{lines}\n"
             "Please answer directly with only the letter of the correct option and nothing else.")
        items.append(_item("realworldqa", i, question=q, images=[png], answer=gold, options=opts))
    return items


def make_mini_benchmark(name: str, seed: int, size: int, n: int, avoid: set[str]) -> list[BenchItem]:
    """About `n` items of benchmark `name` (MMBench: n // 4 questions x 4 circular copies)."""
    rng = random.Random(f"{seed}-mini-{name}")
    draw = Draw(rng, size, avoid)
    if name in ("mmbench", "mmbench_cn"):
        return make_mmbench(name, rng, draw, max(1, n // 4))
    if name in ("ai2d", "mmstar", "seedbench"):
        cats = {"ai2d": None, "mmstar": "coarse perception", "seedbench": None}
        items = make_mc_benchmark(name, rng, draw, n)
        if cats[name]:
            for it in items:
                it.l2_category, it.category = it.category, cats[name]
        return items
    makers = {"chartqa": make_chartqa, "mathvista": make_mathvista, "blink": make_blink,
              "seedbench2_plus": make_seedbench2_plus, "realworldqa": make_realworldqa}
    if name in makers:
        return makers[name](rng, draw, n)
    if name in ("mmvet", "mmvet_v2"):
        return make_mmvet(name, rng, draw, n)
    if name in ("mmmu", "mmmu_pro"):
        return make_mmmu(name, rng, draw, n)
    raise KeyError(f"unknown benchmark {name!r}; expected one of {', '.join(BENCHMARKS)}")
