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

from protege.errors import UserFacingError

REQUIRED_COLUMNS = ("id", "question", "answer", "image")


@dataclass
class Row:
    id: str
    kind: str
    question: str
    answer: str
    candidates: list[str]
    image: Image.Image | list[Image.Image]  # one image, or the list of a question's images in order


def read_parquet_table(path: str | Path, required: tuple[str, ...], what: str = "dataset") -> pd.DataFrame:
    """A parquet table a stage reads; UserFacingError naming the file for a missing file, a folder,
    bytes that are not parquet, or a missing column."""
    path = Path(path)
    if not path.exists():
        raise UserFacingError(f"{path}: {what} file not found")
    if path.is_dir():
        raise UserFacingError(f"{path}: is a folder; expected a {what} parquet file")
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for bytes that are not parquet
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserFacingError(f"{path}: not a readable parquet file ({type(exc).__name__}: {first}); "
                              f"expected the {what} table") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise UserFacingError(f"{path}: missing column(s) {missing}; the {what} table needs {list(required)}")
    return df


def read_table(path: str | Path) -> pd.DataFrame:
    return read_parquet_table(path, REQUIRED_COLUMNS)


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
