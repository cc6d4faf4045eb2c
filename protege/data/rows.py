"""Reading question rows (parquet + images on disk) into memory.

A row: id, split, kind, question, answer, candidates (JSON list), options (JSON list), image (path
relative to the parquet's folder), extra_images (optional JSON list of further image paths, for
questions about several images), difficulty, and target (optional): what SFT trains the student to say when
that is not the bare reference answer, e.g. the answer in a teacher's phrasing ("B." for "B").
"""
from __future__ import annotations

import json
import re
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
    target: str | None = None  # the SFT target when it differs from `answer` (the judge's reference)

    @property
    def sft_target(self) -> str:
        return self.target or self.answer


_ERRNO = re.compile(r"^\[Errno \d+\]\s*")


def _reason(exc: Exception) -> str:
    """An exception's first line, without errno numbers or the file name the message already leads with."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    first = _ERRNO.sub("", str(exc).splitlines()[0] if str(exc) else "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def check_parquet_table(path: str | Path, required: tuple[str, ...], what: str = "dataset",
                        shown: str | Path | None = None) -> None:
    """UserFacingError naming the file (as `shown`, e.g. relative to the project), the table it should be
    and what was expected, for a missing file, a folder, bytes that are not parquet, or a missing column.
    Reads only the parquet footer."""
    import pyarrow.parquet as pq

    path = Path(path)
    name = shown if shown is not None else path
    expected = f"a parquet table with columns {list(required)}"
    if not path.exists():
        raise UserFacingError(f"{name}: {what} file not found; expected {expected}")
    if path.is_dir():
        raise UserFacingError(f"{name}: is a folder; expected the {what} as {expected}")
    try:
        columns = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises several types for bytes that are not parquet
        raise UserFacingError(f"{name}: not a readable parquet file ({_reason(exc)}); expected the {what} table, "
                              f"{expected}") from None
    missing = [c for c in required if c not in columns]
    if missing:
        raise UserFacingError(f"{name}: missing column(s) {missing}; the {what} table needs {list(required)}")


def read_parquet_table(path: str | Path, required: tuple[str, ...], what: str = "dataset",
                       shown: str | Path | None = None) -> pd.DataFrame:
    """A parquet table a stage reads, checked first by `check_parquet_table`."""
    check_parquet_table(path, required, what, shown)
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # a footer that parses over pages that do not
        raise UserFacingError(f"{shown if shown is not None else path}: not a readable parquet file "
                              f"({_reason(exc)}); expected the {what} table") from None


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


def _target(rec: dict, path: str | Path, row: int) -> str | None:
    """A row's optional `target` column: a non-empty string, or empty / null for the reference answer."""
    value = rec.get("target")
    if value is None or (isinstance(value, float) and value != value):  # null, or NaN from pandas
        return None
    if not isinstance(value, str):
        raise UserFacingError(f"{path}: row {row} (id {rec.get('id')!r}): column 'target' holds "
                              f"{type(value).__name__} {value!r}; expected the SFT target as text (or null: the answer)")
    return value or None


def load_rows(path: str | Path) -> list[Row]:
    df = read_table(path)
    rows = []
    for i, rec in enumerate(df.to_dict("records")):
        images = [_open(image_path(path, rel)) for rel in image_paths(rec)]
        rows.append(Row(rec["id"], rec.get("kind", ""), rec["question"], rec["answer"],
                        json.loads(rec.get("candidates") or "[]"), images[0] if len(images) == 1 else images,
                        _target(rec, path, i)))
    return rows
