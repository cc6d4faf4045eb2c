"""Writes the world's train / rl / test splits as parquet + PNG under a folder."""
from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

import pandas as pd

from protege.config import WorldConfig
from protege.world.questions import make_item

SPLITS = ("train", "rl", "val", "test")
COLUMNS = ["id", "split", "kind", "question", "answer", "candidates", "options", "image", "difficulty"]


def split_sizes(cfg: WorldConfig) -> dict[str, int]:
    return {"train": cfg.n_train, "rl": cfg.n_rl, "val": cfg.n_val, "test": cfg.n_test}


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def generate_split(cfg: WorldConfig, split: str, out_dir: Path, seen: set[tuple[str, str]] | None = None) -> pd.DataFrame:
    """One split from its own seed stream. An (image, question) pair already in `seen` (any split) is
    drawn again, so no example repeats and the test split shares none with train."""
    rng = random.Random(f"{cfg.seed}-{split}")
    seen = set() if seen is None else seen
    img_dir = out_dir / "images" / split
    img_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(split_sizes(cfg)[split]):
        for _ in range(1000):
            item = make_item(rng, cfg.image_size)
            png = _png(item.image)
            key = (hashlib.sha256(png).hexdigest(), item.question)
            if key not in seen:
                break
        else:
            raise ValueError(f"world: cannot draw {split_sizes(cfg)[split]} distinct {split} examples; the world "
                             "has fewer distinct (image, question) pairs than requested")
        seen.add(key)
        item_id = f"{split}-{i:06d}"
        rel = Path("images") / split / f"{item_id}.png"
        (out_dir / rel).write_bytes(png)
        rows.append({"id": item_id, "split": split, "kind": item.kind, "question": item.question,
                     "answer": item.answer, "candidates": json.dumps(item.candidates),
                     "options": json.dumps(item.options), "image": str(rel), "difficulty": item.difficulty})
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.to_parquet(out_dir / f"{split}.parquet", index=False)
    return df


def generate_world(cfg: WorldConfig, out_dir: Path) -> dict[str, pd.DataFrame]:
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: set[tuple[str, str]] = set()
    return {split: generate_split(cfg, split, out_dir, seen) for split in SPLITS}
