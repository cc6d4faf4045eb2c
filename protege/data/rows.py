"""Reading question rows (parquet + images on disk) into memory.

A row: id, split, kind, question, answer, candidates (JSON list), options (JSON list), image (path
relative to the parquet's folder), extra_images (optional JSON list of further image paths, for
questions about several images), difficulty.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from PIL import Image

REQUIRED_COLUMNS = ("id", "question", "answer", "image")


@dataclass
class Row:
    id: str
    kind: str
    question: str
    answer: str
    candidates: list[str]
    image: Image.Image | list[Image.Image]  # one image, or the list of a question's images in order


def read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: dataset file not found")
    df = pd.read_parquet(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected at least {list(REQUIRED_COLUMNS)}")
    return df


def image_path(table_path: str | Path, rel: str) -> Path:
    return Path(table_path).parent / rel


def image_paths(rec: dict) -> list[str]:
    """Every image path of a row, in order: `image`, then `extra_images` when present."""
    extra = rec.get("extra_images")
    return [rec["image"], *(json.loads(extra) if isinstance(extra, str) and extra else [])]


def _open(path: Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")


def load_rows(path: str | Path) -> list[Row]:
    df = read_table(path)
    rows = []
    for rec in df.to_dict("records"):
        images = [_open(image_path(path, rel)) for rel in image_paths(rec)]
        rows.append(Row(rec["id"], rec.get("kind", ""), rec["question"], rec["answer"],
                        json.loads(rec.get("candidates") or "[]"), images[0] if len(images) == 1 else images))
    return rows
