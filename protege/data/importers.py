"""Importers for user datasets in the layouts `protege.data.layouts` reads (LLaVA conversations, flat JSON /
JSONL records, parquet tables: Hugging Face exports, verl / EasyR1).

They produce the question-row schema (protege.data.schemas): one row per question with its images, images
copied once under OUT/images/<sha256>.<ext>, rows deduplicated by (image hashes, question). Every source
row is kept long enough to be validated, so a bad row is reported by its file and line, not skipped in
silence. Image paths resolve inside the images folder (symlinks followed); absolute paths and paths leading
out of it are refused unless the user allows them.

A file is read as it goes, `BATCH_ROWS` records at a time: each batch's images are resolved, checked
(decoded, sized) and hashed, written once by content, and dropped, so memory holds one batch's images and
the split's rows without them (a parquet export with its images embedded is never in memory whole). The
suite then runs on the whole split's rows, so the report names the same rows whatever the batch size.

Nothing is written under OUT (images included) until every split validates: images wait in a
content-addressed cache beside OUT (`.OUT-import-cache/`, with an index of what each image file or payload
gave when checked). A rejected import (`protege data import`, the data stage) keeps that cache, and says
so, because hashing and checking 100k images takes minutes and fixing one row should not redo them: the
next run reads again only the images that are new or changed (a file is known by its path, size and
modification time). The cache goes once an import has written OUT.

Images in place (`--images-in-place`, `data.images_in_place`): the table names each image file where it is
(its resolved absolute path), checked and hashed as always but not copied, so a 100 GB image folder is not
stored a second time. The default copies: the project then owns its data, DVC versions the images with the
tables, and the import survives the source folder moving or changing. In place, the tables depend on files
outside the project that DVC does not store (`protege dag` lists `data.images` as the data stage's
dependency, so DVC re-runs the import when that folder changes), and images given inside the data (bytes,
base64) are still stored under OUT/images/, there being no file to point at.
"""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from stat import S_ISDIR
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import pandas as pd

from protege.data.image_bytes import sniff_ext
from protege.data.layouts import Record, iter_file, read_file
from protege.data.schemas import OPTION_LETTERS, QUESTION_ROWS
from protege.data.validate import (
    DatasetInvalid,
    answer_in_options,
    image_bytes_checks,
    run_suite,
)
from protege.files import write_atomic
from protege.progress import Progress

MAX_IMAGE_FILE_BYTES = 256 * 1024 * 1024  # a larger file is a mistake, not a training image
BATCH_ROWS = 1024  # records whose images are in memory at once: a few hundred MB of large images at most
SHOW_NOTES = 10    # rows a rejection names with their reason; the report lists them all
CACHE_INDEX = "checked.jsonl"


@dataclass
class ImportResult:
    table: Path | None
    report: Path
    rows_read: int
    rows_written: int
    duplicates_dropped: int
    images_written: int


def _image_source(value, image_root: Path, allow_outside: bool = False
                  ) -> tuple[bytes | tuple[str, os.stat_result] | None, str]:
    """An image given as a path (the resolved file and its stat, read later), a data URL, raw base64, bytes,
    or a {'bytes'|'path'} dict; (None, why) when there is none.

    A path must resolve (symlinks followed) inside `image_root` and may not be absolute, unless
    `allow_outside`: a dataset must not be able to copy arbitrary files of this machine into the output."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None, "no image given"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), ""
    if not isinstance(value, str) or not value.strip():
        return None, f"no image given (got {type(value).__name__})" if not isinstance(value, str) else "no image given"
    value = value.strip()
    if value.startswith("data:"):
        try:
            return base64.b64decode(value.split(",", 1)[1], validate=True), ""
        except (binascii.Error, IndexError):
            return None, "data URL is not valid base64"
    try:
        found = _image_file(value, image_root, allow_outside)
    except OSError:  # e.g. a name longer than the file system allows: not a path, maybe base64
        found = None
    if found is not None:
        return found
    if len(value) >= 64 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", value):
        try:
            return base64.b64decode(value, validate=False), ""
        except binascii.Error:
            pass
    return None, f"image file not found: {value if Path(value).is_absolute() else image_root / value}"


@functools.lru_cache(maxsize=64)
def _real_root(image_root: Path) -> str:
    return os.path.realpath(image_root)


def _image_file(value: str, image_root: Path, allow_outside: bool
                ) -> tuple[tuple[str, os.stat_result] | None, str] | None:
    """((resolved file, its stat) or None, why) for a value that names an existing path; None when it names
    no file. os.path rather than pathlib: this runs for every image of 100k-row files."""
    if len(value) < 1024:
        absolute = os.path.isabs(value)
        if absolute and not allow_outside:
            if os.path.exists(value):
                return None, f"absolute image path {value!r} refused (pass --allow-outside-images to read it)"
        else:
            path = value if absolute else os.path.join(image_root, value)
            try:
                os.lstat(path)  # the path itself, a link that leads nowhere included
            except (FileNotFoundError, NotADirectoryError):
                return None
            resolved = os.path.realpath(path)
            if not allow_outside:
                root = _real_root(image_root)
                if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
                    return None, (f"image path {value!r} resolves to {resolved}, outside {image_root} "
                                  "(pass --allow-outside-images to read it)")
            try:
                stat = os.stat(resolved)
            except OSError:
                return None, f"image path {value!r} is a broken link"
            if S_ISDIR(stat.st_mode):
                return None, f"image path {value!r} is a folder, not an image file"
            if stat.st_size > MAX_IMAGE_FILE_BYTES:
                return None, (f"image file {value!r} is too large: {stat.st_size} bytes "
                              f"(at most {MAX_IMAGE_FILE_BYTES})")
            return (resolved, stat), ""
    return None


@dataclass(frozen=True)
class Checked:
    """What one image gave: where the table will name it, its hash, and the suite's two image checks."""
    rel: str | None      # None: no image could be read (`note` says why)
    digest: str = ""
    decodes: bool = False
    fits: bool = True
    note: str = ""


class ImageStore:
    """The content-addressed cache images wait in until an import is written: images/<sha256><ext> (the good
    ones; none that are kept in place) and an index of what each image gave when checked, keyed by the file
    (path, size, modification time) and by the content hash. It outlives a failed run: what it holds is not
    read, hashed, checked or written again."""

    def __init__(self, folder: Path, in_place: bool = False, threads: int | None = None):
        self.folder, self.in_place = Path(folder), in_place
        self.index: dict[str, tuple[str, str, bool, bool, str]] = {}  # key -> (digest, ext, decodes, fits, note)
        self.threads = threads or min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                      else (os.cpu_count() or 1))
        self._made = False
        self._lock = threading.Lock()
        index = self.folder / CACHE_INDEX
        if index.is_file():
            with index.open(encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        key, digest, ext, decodes, fits, note = json.loads(line)
                    except (ValueError, TypeError):
                        continue  # a line cut short when a run was killed
                    self.index[key] = (digest, ext, bool(decodes), bool(fits), note)

    def _stored(self, digest: str, rel: str) -> bool:
        """Whether the cache holds this image whole: its index line is written after the file, so a file a
        killed run was writing is not trusted."""
        return f"stored\x00{digest}" in self.index and (self.folder / rel).is_file()

    def _write(self, rel: str, data: bytes) -> None:
        if not self._made:
            with self._lock:
                (self.folder / "images").mkdir(parents=True, exist_ok=True)
                self._made = True
        tmp = self.folder / f"{rel}.{threading.get_ident()}.part"  # whole or absent: a killed run leaves a .part
        tmp.write_bytes(data)
        os.replace(tmp, self.folder / rel)

    def check(self, value, image_root: Path, allow_outside: bool) -> tuple[Checked, list[tuple]]:
        """One image value: (what it gave, index entries new to this run). Thread-safe: the store's own state
        changes only in `add`."""
        src, why = _image_source(value, image_root, allow_outside)
        if src is None:
            return Checked(None, note=why), []
        entries = []
        file_key = None
        if isinstance(src, tuple):
            path, stat = src
            file_key = f"file\x00{path}\x00{stat.st_size}\x00{stat.st_mtime_ns}"
            known = self.index.get(file_key)
            if known is not None:
                digest, ext, decodes, fits, note = known
                rel = f"images/{digest}{ext}"
                if self.in_place or not (decodes and fits) or self._stored(digest, rel):
                    return Checked(str(path) if self.in_place else rel, digest, decodes, fits, note), []
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                return Checked(None, note=f"image path {value!r} cannot be read ({exc.strerror or exc})"), []
        else:
            data = src
        digest = hashlib.sha256(data).hexdigest()
        known = self.index.get(f"sha\x00{digest}")
        if known is not None:
            _, ext, decodes, fits, note = known
        else:
            decodes, fits, note = image_bytes_checks(data)
            ext = sniff_ext(data)
            entries.append((f"sha\x00{digest}", digest, ext, decodes, fits, note))
        if file_key is not None:
            entries.append((file_key, digest, ext, decodes, fits, note))
        rel = f"images/{digest}{ext}"
        kept_in_place = self.in_place and file_key is not None
        if decodes and fits and not kept_in_place and not self._stored(digest, rel):
            self._write(rel, data)
            entries.append((f"stored\x00{digest}", digest, ext, decodes, fits, note))
        return Checked(str(src[0]) if kept_in_place else rel, digest, decodes, fits, note), entries

    def add(self, entries: list[tuple]) -> None:
        """Records a batch's new index entries, on disk at once: a run killed after it loses nothing."""
        lines = []
        for e in entries:
            self.index[e[0]] = e[1:]
            lines.append(json.dumps(list(e), ensure_ascii=False) + "\n")
        if lines:
            self.folder.mkdir(parents=True, exist_ok=True)
            with (self.folder / CACHE_INDEX).open("a", encoding="utf-8") as f:
                f.writelines(lines)

    def checks(self, values: list, image_root: Path, allow_outside: bool) -> list[Checked]:
        """`check` over a batch's image values, in order; reading, hashing and decoding release the GIL, so
        threads spread them over the cores."""
        def run(part: list) -> list:
            return [self.check(v, image_root, allow_outside) for v in part]

        if self.threads > 1 and len(values) > 1:
            step = -(-len(values) // self.threads)  # one slice a thread: a task per image costs as much as a hit
            with ThreadPoolExecutor(self.threads) as pool:
                results = [r for part in pool.map(run, [values[i:i + step] for i in range(0, len(values), step)])
                           for r in part]
        else:
            results = run(values)
        self.add([e for _, entries in results for e in entries])
        return [c for c, _ in results]

    def kept_line(self) -> str:
        """The line a rejection ends with when this run's checked images are kept for the next one."""
        if not (self.folder / CACHE_INDEX).is_file():
            return ""
        images = len({v[0] for v in self.index.values()})
        return (f"\n{images} image(s) already read and checked are kept in {self.folder} for the next run, "
                "which reads again only new or changed images (delete the folder to start afresh)")

    def kept(self, exc: DatasetInvalid) -> DatasetInvalid:
        """`exc` with `kept_line`, to raise in its place."""
        line = self.kept_line()
        return DatasetInvalid(f"{exc}{line}") if line else exc

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _beside(out_dir: Path) -> Path:
    """The folder beside OUT (its first existing ancestor): images then move on one file system."""
    return next((p for p in [out_dir.parent, *out_dir.parent.parents] if p.is_dir()), Path.cwd())


def cache_folder(out_dir: Path) -> Path:
    """The image cache for OUT: beside it, named after it and the same every run, so that a run finds what
    a failed one checked. Not `.OUT.import-*` / `.OUT.*`: the temporary folders of a run, that none
    outlives, have those names."""
    return _beside(Path(out_dir)) / f".{Path(out_dir).name}-import-cache"


ROW_COLUMNS = ["id", "question", "answer", "target", "source", "parsed", "parse_error", "options", "kind", "image",
               "extra_images", "image_sha256", "image_note", "image_readable", "image_size_ok"]


def _batches(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def read_rows(records: Iterable[Record], image_root: Path, store: ImageStore, allow_outside: bool = False,
              batch_rows: int = BATCH_ROWS, progress: Callable[[int], None] | None = None) -> pd.DataFrame:
    """The rows of a file's records, their images checked, hashed and stored batch by batch: ROW_COLUMNS,
    one row per record (duplicates included, see `finish_rows`), no image bytes. Ids default to FILE:ROW."""
    cols: dict[str, list] = {c: [] for c in ROW_COLUMNS}
    for batch in _batches(records, batch_rows):
        values = [r.images if len(r.images) else [None] for r in batch]  # no image: one "no image given"
        checked = iter(store.checks([v for vs in values for v in vs], image_root, allow_outside))
        for rec, vs in zip(batch, values):
            rels, digests, why, decodes_all, fits_all = [], [], "", True, True
            for c in (next(checked) for _ in vs):
                if c.rel is None:
                    why, decodes_all = why or c.note, False
                    continue
                rels.append(c.rel)
                digests.append(c.digest)
                why = why or c.note
                decodes_all &= c.decodes
                fits_all &= c.fits
            cols["id"].append(rec.id if rec.id is not None else rec.source)
            cols["question"].append(rec.question)
            cols["answer"].append(rec.answer)
            cols["target"].append(rec.target)
            cols["source"].append(rec.source)
            cols["parsed"].append(not rec.error)
            cols["parse_error"].append(rec.error)
            cols["options"].append(json.dumps(rec.options, ensure_ascii=False))
            cols["kind"].append(rec.kind)
            cols["image"].append(rels[0] if rels else "")
            cols["extra_images"].append(json.dumps(rels[1:]))
            cols["image_sha256"].append("+".join(digests))
            cols["image_note"].append(why)
            cols["image_readable"].append(decodes_all and bool(rels))
            cols["image_size_ok"].append(fits_all)
        if progress is not None:
            progress(len(batch))
    return pd.DataFrame(cols, columns=ROW_COLUMNS)


def file_rows(path: Path, image_root: Path, store: ImageStore, columns: dict[str, str] | None = None,
              allow_outside: bool = False, batch_rows: int = BATCH_ROWS,
              progress: Callable[[int], None] | None = None) -> pd.DataFrame:
    """One dataset file, streamed, as `read_rows`."""
    return read_rows(iter_file(path, columns), image_root, store, allow_outside, batch_rows, progress)


def finish_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """A file's rows deduplicated (identical images and question: one example; rows without a parse stay
    for the report), with the option check and stripped text. Returns (rows, duplicates dropped)."""
    before = len(df)
    key = df["image_sha256"] + "\x00" + df["question"].fillna("").astype(str)
    dup = key.duplicated() & df["parsed"] & (df["image_sha256"] != "")
    df = df[~dup].reset_index(drop=True)
    df["answer_in_options"] = [answer_in_options(a, o) for a, o in zip(df["answer"], df["options"])]
    for col in ("question", "answer"):
        df[col] = df[col].map(lambda v: v.strip() if isinstance(v, str) else v)
    return df, before - len(df)


def records_frame(records: list[Record]) -> pd.DataFrame:
    """Records as a frame with their raw image values (whole files in memory: for small files and tests)."""
    return pd.DataFrame([{"id": r.id, "question": r.question, "answer": r.answer, "target": r.target,
                          "image_values": list(r.images), "source": r.source, "parsed": not r.error,
                          "parse_error": r.error, "options": json.dumps(r.options, ensure_ascii=False),
                          "kind": r.kind} for r in records],
                        columns=["id", "question", "answer", "target", "image_values", "source", "parsed",
                                 "parse_error", "options", "kind"])


def file_frame(path: Path, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """One dataset file as `records_frame`; ids default to FILE:ROW."""
    frame = records_frame(read_file(path, columns))
    frame["id"] = [rid if rid is not None else src for rid, src in zip(frame["id"], frame["source"])]
    return frame


def progress_done(progress: Progress) -> None:
    """The closing line of a count whose total was not known ahead (JSON files): it reports only when done."""
    if progress.total is None:
        progress.total = progress.done
        progress.update(0)


def parquet_rows(path: Path) -> int | None:
    """A parquet file's row count from its footer (None for JSON, whose count is known once read)."""
    if path.suffix.lower() != ".parquet":
        return None
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None  # reading it names the file as unreadable


def import_dataset(path: str | Path, fmt: str, out_dir: str | Path, name: str,
                   image_root: str | Path | None = None, allow_outside_images: bool = False,
                   columns: dict[str, str] | None = None, images_in_place: bool = False,
                   batch_rows: int = BATCH_ROWS, say: Callable[[str], None] | None = None,
                   cache: Path | None = None) -> ImportResult:
    """Imports and validates a dataset, then writes OUT/NAME.parquet, OUT/images/ and
    OUT/NAME.validation.json. A rejected dataset writes nothing under OUT (its validation report goes
    to a temporary folder named in the error). `fmt` is kept for the command line's --format: every layout
    of `protege.data.layouts` is read whatever it says, `llava` and `parquet` only check the suffix.
    `say`: progress lines. `cache`: the folder images wait in, kept after a rejection for the next run
    (`protege data import` gives `cache_folder(OUT)`); None: a temporary one beside OUT, removed whatever
    happens, as the retraining pool wants (its OUT is inside a folder DVC versions whole, and a rejected
    file is not imported again)."""
    path, out_dir = Path(path), Path(out_dir)
    if not path.exists():
        raise DatasetInvalid(f"{path}: file not found")
    if path.is_dir():
        raise DatasetInvalid(f"{path}: is a folder; expected a .json/.jsonl conversation file or a .parquet table")
    if fmt not in FORMATS:
        raise DatasetInvalid(f"unknown format {fmt!r}; expected one of {sorted(FORMATS)}")
    if FORMATS[fmt] and path.suffix.lower() not in FORMATS[fmt]:
        raise DatasetInvalid(f"{path}: format {fmt!r} expects a {' or '.join(FORMATS[fmt])} file")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise DatasetInvalid(f"table name {name!r}: use letters, digits, '_', '.' and '-' only")
    image_root = Path(image_root) if image_root else path.parent
    if not image_root.is_dir():
        raise DatasetInvalid(f"{image_root}: the images folder does not exist")
    if out_dir.exists() and not out_dir.is_dir():
        raise DatasetInvalid(f"{out_dir}: exists and is not a folder")
    temporary = cache is None
    folder = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.import-", dir=_beside(out_dir))) if temporary else cache
    store = ImageStore(folder, images_in_place)
    progress = Progress("rows", parquet_rows(path), say=say) if say is not None else None
    done = False
    try:
        frame = file_rows(path, image_root, store, columns, allow_outside_images, batch_rows,
                          progress.update if progress is not None else None)
        if progress is not None:
            progress_done(progress)
        if frame.empty:
            raise DatasetInvalid(f"{path}: no rows; expected at least one record")
        frame["file"] = [path] * len(frame)
        result = write_table(stage_split(frame, out_dir, name), out_dir, store)
        done = True
    except DatasetInvalid as exc:
        if temporary:
            raise
        raise store.kept(exc) from None
    finally:
        if done or temporary:
            store.remove()
    return result


FORMATS = {"auto": (), "llava": (".json", ".jsonl"), "parquet": (".parquet",)}


@dataclass
class StagedSplit:
    """A split's rows, checked, with their images in the cache until `write_table` puts them under OUT."""
    name: str
    rows: pd.DataFrame
    report: dict
    staged: list[str]    # images/<sha256><ext> of the cache the rows name
    rows_read: int
    dropped: int
    images: set[str] = field(default_factory=set)  # every image the rows name (in the cache or in place)


def _notes(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(source, why) of each row with a reason: its parse error, else its image's note."""
    notes = {s: e for s, e in zip(df["source"], df["parse_error"]) if e}
    notes.update({s: n for s, n, ok in zip(df["source"], df["image_note"], df["parsed"]) if n and ok})
    return list(notes.items())


def stage_split(frame: pd.DataFrame, out_dir: Path, name: str, shown_out: Path | None = None) -> StagedSplit:
    """Deduplicates a split's rows (`read_rows`' frame; column `file`: each row's file) file by file and runs
    the suite over all of them. DatasetInvalid naming the bad rows (the first SHOW_NOTES with their reason,
    all of them in the report)."""
    files = frame.pop("file")
    parts, dropped = [], 0
    for source in dict.fromkeys(files):
        part, n = finish_rows(frame[(files == source).to_numpy()].reset_index(drop=True))
        parts.append(part)
        dropped += n
    df = pd.concat(parts, ignore_index=True) if parts else frame
    shown = ", ".join(str(p) for p in dict.fromkeys(files))
    report, failures = run_suite({shown: df}, QUESTION_ROWS)
    report.update({"rows_read": len(frame), "duplicates_dropped": dropped, "images_written": 0})
    if failures:
        notes = _notes(df)
        report["row_notes"] = [{"source": s, "note": n} for s, n in notes]
        report_path = Path(tempfile.mkdtemp(prefix="protege-import-")) / f"{name}.validation.json"
        report_path.write_text(json.dumps(report, indent=2, default=str))
        lines = [f.line() for f in failures]
        details = [f"  {s}: {n}" for s, n in notes[:SHOW_NOTES]]
        if len(notes) > SHOW_NOTES:
            details.append(f"  and {len(notes) - SHOW_NOTES} more row(s) with a reason (all in the report)")
        raise DatasetInvalid(f"{shown}: {len(failures)} expectation(s) failed; nothing written to "
                             f"{shown_out or out_dir} "
                             f"(report: {report_path})\n"
                             + "\n".join(lines + (["details:"] + details if details else [])))
    images = {r for rels in ([i, *json.loads(e)] for i, e in zip(df["image"], df["extra_images"])) for r in rels if r}
    staged = sorted(r for r in images if not Path(r).is_absolute())
    return StagedSplit(name, df, report, staged, len(frame), dropped, images)


TABLE_COLUMNS = ["id", "split", "kind", "question", "answer", "candidates", "options", "image", "extra_images",
                 "image_sha256", "difficulty", "target", "source"]


def candidates_of(options_json: str) -> str:
    """A multiple-choice row's short answers are its option letters (the judge reads among them)."""
    options = json.loads(options_json) if options_json else []
    return json.dumps(list(OPTION_LETTERS[:len(options)]))


def _place(src: Path, dst: Path) -> None:
    """A cached image under OUT: a hard link (no second copy, and the cache stays whole until the import is
    done), else a copy."""
    tmp = dst.with_name(f".{dst.name}.part")
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def write_table(split: StagedSplit, out_dir: Path, store: ImageStore) -> ImportResult:
    """Puts a staged split's cached images under OUT/images (each once: a file already there is the same
    content) and writes OUT/NAME.parquet and OUT/NAME.validation.json. The cache stays: the caller removes
    it once every split is written."""
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    written = 0
    for rel in split.staged:
        if not (out_dir / rel).exists():
            _place(store.folder / rel, out_dir / rel)
            written += 1
    split.report["images_written"] = written
    df = split.rows
    df = df.assign(split=split.name, difficulty=0, candidates=[candidates_of(o) for o in df["options"]],
                   target=[t if isinstance(t, str) and t and t != a else None for t, a in zip(df["target"], df["answer"])])
    table = out_dir / f"{split.name}.parquet"
    write_atomic(table, lambda tmp: df[TABLE_COLUMNS].to_parquet(tmp, index=False))
    report_path = out_dir / f"{split.name}.validation.json"
    write_atomic(report_path, lambda tmp: tmp.write_text(json.dumps(split.report, indent=2, default=str)))
    return ImportResult(table, report_path, split.rows_read, len(df), split.dropped, written)
