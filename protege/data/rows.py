"""Reading question rows (parquet + images on disk): the text in memory, the images as paths.

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


@dataclass(frozen=True, slots=True)
class ImageFiles:
    """A row's images on disk, named by their paths relative to the table's folder: what a Row read from a
    table holds in place of pixels, so a table of any size costs its text and paths. `load` decodes them
    anew on every call; `table`, `row` and `id` name the row in errors."""
    table: Path
    row: int
    id: str
    rels: tuple[str, ...]

    def paths(self) -> list[Path]:
        return [image_path(self.table, rel) for rel in self.rels]

    def load(self) -> Image.Image | list[Image.Image]:
        images = [self._read(path, _decoded) for path in self.paths()]
        return images[0] if len(images) == 1 else images

    def sizes(self) -> list[tuple[int, int]]:
        """(width, height) of each image from its file's header: no pixel is decoded."""
        return [self._read(path, _header_size) for path in self.paths()]

    def _read(self, path: Path, read):
        try:
            return read(path)
        except MemoryError:  # the machine's trouble, not the file's
            raise
        except Exception as exc:  # PIL raises many types for bytes that are not an image
            raise UserFacingError(f"{self.table}: row {self.row} (id {self.id!r}): image {path} cannot be read "
                                  f"({_reason(exc)})") from None


def _decoded(path: Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")


def _header_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


ImageSource = Image.Image | list[Image.Image] | ImageFiles | None  # pixels in memory, or files to decode


def decoded(source: ImageSource) -> Image.Image | list[Image.Image] | None:
    """A row's images as the processor takes them: files are decoded now (and not kept), pixels pass as they are."""
    return source.load() if isinstance(source, ImageFiles) else source


def image_count(source: ImageSource) -> int:
    if isinstance(source, ImageFiles):
        return len(source.rels)
    return 0 if source is None else len(source) if isinstance(source, (list, tuple)) else 1


def image_sizes(source: ImageSource) -> list[tuple[int, int]]:
    """(width, height) of each image, read from the files' headers when the images are on disk."""
    if isinstance(source, ImageFiles):
        return source.sizes()
    return [im.size for im in ([] if source is None else source if isinstance(source, (list, tuple)) else [source])]


def stand_ins(source: ImageSource) -> Image.Image | list[Image.Image] | None:
    """Blank images of the sizes of a row's images, shaped as `decoded` returns them: the processor's token
    count depends on an image's size only, so prompt lengths can be measured without decoding a pixel."""
    if source is None:
        return None
    blanks = [Image.new("RGB", size) for size in image_sizes(source)]
    several = isinstance(source, (list, tuple)) or (isinstance(source, ImageFiles) and len(source.rels) > 1)
    return blanks if several else blanks[0]


class Row:
    """One question. `image` is decoded on each access and never kept on the row (a table of a million rows
    would not fit in memory decoded): read it once per use. `source` is what the row holds: the image files
    (load_rows), or images already in memory (rows built in code)."""

    __slots__ = ("id", "kind", "question", "answer", "candidates", "source", "target")

    def __init__(self, id: str, kind: str, question: str, answer: str, candidates: list[str], image: ImageSource,
                 target: str | None = None):
        # image: one image, the list of a question's images in order, or their files (ImageFiles)
        self.id, self.kind, self.question, self.answer, self.candidates = id, kind, question, answer, candidates
        self.source, self.target = image, target  # target: the SFT target when it differs from `answer`

    @property
    def image(self) -> Image.Image | list[Image.Image] | None:
        return decoded(self.source)

    @property
    def image_count(self) -> int:
        return image_count(self.source)

    def image_sizes(self) -> list[tuple[int, int]]:
        return image_sizes(self.source)

    @property
    def sft_target(self) -> str:
        return self.target or self.answer

    def __repr__(self) -> str:
        return f"Row(id={self.id!r}, kind={self.kind!r}, question={self.question!r}, answer={self.answer!r})"


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
    """The table's rows, each holding its image paths: nothing is decoded here (Row.image, or the batches of
    protege.data.loader, decode them when used)."""
    df = read_table(path)
    table = Path(path)  # one object every row's ImageFiles shares
    rows = []
    for i, rec in enumerate(df.to_dict("records")):
        files = ImageFiles(table, i, rec["id"], tuple(image_paths(rec)))
        rows.append(Row(rec["id"], rec.get("kind", ""), rec["question"], rec["answer"],
                        json.loads(rec.get("candidates") or "[]"), files, _target(rec, path, i)))
    return rows
