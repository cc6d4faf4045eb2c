"""Writes the world's train / rl / test splits as parquet + PNG under a folder."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd

from protege.config import WorldConfig
from protege.world.questions import make_item

SPLITS = ("train", "rl", "test")
COLUMNS = ["id", "split", "kind", "question", "answer", "candidates", "options", "image", "difficulty"]


def split_sizes(cfg: WorldConfig) -> dict[str, int]:
    return {"train": cfg.n_train, "rl": cfg.n_rl, "test": cfg.n_test}


def generate_split(cfg: WorldConfig, split: str, out_dir: Path) -> pd.DataFrame:
    """One split; a different seed stream per split keeps the test set held out."""
    rng = random.Random(f"{cfg.seed}-{split}")
    img_dir = out_dir / "images" / split
    img_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(split_sizes(cfg)[split]):
        item = make_item(rng, cfg.image_size)
        item_id = f"{split}-{i:06d}"
        rel = Path("images") / split / f"{item_id}.png"
        item.image.save(out_dir / rel)
        rows.append({"id": item_id, "split": split, "kind": item.kind, "question": item.question,
                     "answer": item.answer, "candidates": json.dumps(item.candidates),
                     "options": json.dumps(item.options), "image": str(rel), "difficulty": item.difficulty})
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.to_parquet(out_dir / f"{split}.parquet", index=False)
    return df


def generate_world(cfg: WorldConfig, out_dir: Path) -> dict[str, pd.DataFrame]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return {split: generate_split(cfg, split, out_dir) for split in SPLITS}
