"""Importers for user datasets in the layouts `protege.data.layouts` reads (LLaVA conversations, flat JSON /
JSONL records, parquet tables: Hugging Face exports, verl / EasyR1).

They produce the question-row schema (protege.data.schemas): one row per question with its images, images
copied once under OUT/images/<sha256>.<ext>, rows deduplicated by (image hashes, question). Every source
row is kept long enough to be validated, so a bad row is reported by its file and line, not skipped in
silence. Nothing is written under OUT (images included) until the whole file validates: images wait
in a hidden staging folder beside OUT, removed whatever happens. Image paths
resolve inside the images folder (symlinks followed); absolute paths and paths leading out of it are
refused unless the user allows them.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from protege.data.image_bytes import sniff_ext
from protege.data.layouts import Record, read_file
from protege.data.schemas import OPTION_LETTERS, QUESTION_ROWS
from protege.data.validate import (
    DatasetInvalid,
    answer_in_options,
    image_bytes_checks,
    run_suite,
)
from protege.files import write_atomic

MAX_IMAGE_FILE_BYTES = 256 * 1024 * 1024  # a larger file is a mistake, not a training image


@dataclass
class ImportResult:
    table: Path | None
    report: Path
    rows_read: int
    rows_written: int
    duplicates_dropped: int
    images_written: int


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _image_bytes(value, image_root: Path, allow_outside: bool = False) -> tuple[bytes | None, str]:
    """Bytes of an image given as a path, a data URL, raw base64, bytes, or a {'bytes'|'path'} dict.

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
        found = _read_image_path(value, image_root, allow_outside)
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


def _read_image_path(value: str, image_root: Path, allow_outside: bool) -> tuple[bytes | None, str] | None:
    """(bytes or None, why) for a value that names an existing path; None when it names no file."""
    if len(value) < 1024:
        given = Path(value)
        if given.is_absolute() and not allow_outside:
            if given.exists():
                return None, f"absolute image path {value!r} refused (pass --allow-outside-images to read it)"
        else:
            path = given if given.is_absolute() else image_root / given
            if path.exists() or path.is_symlink():
                resolved = path.resolve()
                if not allow_outside and not _inside(resolved, image_root.resolve()):
                    return None, (f"image path {value!r} resolves to {resolved}, outside {image_root} "
                                  "(pass --allow-outside-images to read it)")
                if resolved.is_dir():
                    return None, f"image path {value!r} is a folder, not an image file"
                if not resolved.exists():
                    return None, f"image path {value!r} is a broken link"
                size = resolved.stat().st_size
                if size > MAX_IMAGE_FILE_BYTES:
                    return None, f"image file {value!r} is too large: {size} bytes (at most {MAX_IMAGE_FILE_BYTES})"
                try:
                    return resolved.read_bytes(), ""
                except OSError as exc:
                    return None, f"image path {value!r} cannot be read ({exc.strerror or exc})"
    return None


def records_frame(records: list[Record]) -> pd.DataFrame:
    """Records as the rows `materialise` checks: a record that gave no question stays, unparsed, for the report."""
    return pd.DataFrame([{"id": r.id, "question": r.question, "answer": r.answer, "target": r.target,
                          "image_values": list(r.images), "source": r.source, "parsed": not r.error,
                          "parse_error": r.error, "options": json.dumps(r.options, ensure_ascii=False),
                          "kind": r.kind} for r in records],
                        columns=["id", "question", "answer", "target", "image_values", "source", "parsed",
                                 "parse_error", "options", "kind"])


def file_frame(path: Path, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """One dataset file in any layout `protege.data.layouts` reads; ids default to FILE:ROW."""
    frame = records_frame(read_file(path, columns))
    frame["id"] = [rid if rid is not None else src for rid, src in zip(frame["id"], frame["source"])]
    return frame


def materialise(frame: pd.DataFrame, image_root: Path, staging: Path, allow_outside: bool = False
                ) -> tuple[pd.DataFrame, int, list[str]]:
    """Checks every image of every row and writes the good ones, once each by content, under `staging` (not
    the output folder); adds the derived check columns; deduplicates. Returns (rows, duplicates dropped, staged
    paths)."""
    staged: list[str] = []
    firsts, extras, hashes, notes, readable, size_ok = [], [], [], [], [], []
    for values in frame["image_values"]:
        rels, digests, why, decodes_all, fits_all = [], [], "", True, True
        for value in (values if len(values) else [None]):
            data, note = _image_bytes(value, image_root, allow_outside)
            if data is None:
                why, decodes_all = why or note, False
                continue
            decodes, fits, bad = image_bytes_checks(data)
            digest = hashlib.sha256(data).hexdigest()
            rel = f"images/{digest}{sniff_ext(data)}"
            if decodes and fits and not (staging / rel).exists():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).write_bytes(data)
                staged.append(rel)
            rels.append(rel)
            digests.append(digest)
            why = why or bad
            decodes_all &= decodes
            fits_all &= fits
        firsts.append(rels[0] if rels else "")
        extras.append(json.dumps(rels[1:]))
        hashes.append("+".join(digests))
        notes.append(why)
        readable.append(decodes_all and bool(rels))
        size_ok.append(fits_all)
    df = frame.drop(columns=["image_values"]).assign(image=firsts, extra_images=extras, image_sha256=hashes,
                                                     image_note=notes, image_readable=readable,
                                                     image_size_ok=size_ok)
    before = len(df)
    # identical (images, question) pairs are one example; rows without a parse are kept for the report
    key = df["image_sha256"] + "\x00" + df["question"].fillna("").astype(str)
    dup = key.duplicated() & df["parsed"] & (df["image_sha256"] != "")
    df = df[~dup].reset_index(drop=True)
    options = df["options"] if "options" in df else [""] * len(df)
    df["answer_in_options"] = [answer_in_options(a, o) for a, o in zip(df["answer"], options)]
    for col in ("question", "answer"):
        df[col] = df[col].map(lambda v: v.strip() if isinstance(v, str) else v)
    return df, before - len(df), staged


def import_dataset(path: str | Path, fmt: str, out_dir: str | Path, name: str,
                   image_root: str | Path | None = None, allow_outside_images: bool = False,
                   columns: dict[str, str] | None = None) -> ImportResult:
    """Imports and validates a dataset, then writes OUT/NAME.parquet, OUT/images/ and
    OUT/NAME.validation.json. A rejected dataset writes nothing under OUT (its validation report goes
    to a temporary folder named in the error). `fmt` is kept for the command line's --format: every layout
    of `protege.data.layouts` is read whatever it says, `llava` and `parquet` only check the suffix."""
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
    frame = file_frame(path, columns)
    if frame.empty:
        raise DatasetInvalid(f"{path}: no rows; expected at least one record")
    return write_table(stage_split(frame, {path: image_root}, out_dir, name, allow_outside_images), out_dir)


FORMATS = {"auto": (), "llava": (".json", ".jsonl"), "parquet": (".parquet",)}


@dataclass
class StagedSplit:
    """A split's rows, checked, with their images in a staging folder until `write_table` moves them."""
    name: str
    rows: pd.DataFrame
    report: dict
    staging: Path
    staged: list[str]
    rows_read: int
    dropped: int


def stage_split(frame: pd.DataFrame, roots: dict[Path, Path], out_dir: Path, name: str,
                allow_outside: bool = False, shown_out: Path | None = None) -> StagedSplit:
    """Reads the images of a split's rows (`roots`: source file -> the folder its relative image paths resolve
    in; the frame's `file` column names each row's file, else the one file of `roots`) into a staging folder
    beside OUT and runs the suite. DatasetInvalid naming every bad row; the staging folder is gone then."""
    parent = next((p for p in [out_dir.parent, *out_dir.parent.parents] if p.is_dir()), Path.cwd())
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.import-", dir=parent))
    try:
        parts, dropped, staged = [], 0, []
        files = frame.pop("file") if "file" in frame else pd.Series([next(iter(roots))] * len(frame))
        for source in dict.fromkeys(files):
            part, n, more = materialise(frame[(files == source).to_numpy()].reset_index(drop=True), roots[source],
                                        staging, allow_outside)
            parts.append(part)
            dropped += n
            staged += more
        df = pd.concat(parts, ignore_index=True) if parts else frame
        shown = ", ".join(str(p) for p in roots)
        report, failures = run_suite({shown: df}, QUESTION_ROWS)
        report.update({"rows_read": len(frame), "duplicates_dropped": dropped, "images_written": 0})
        if failures:
            report_path = Path(tempfile.mkdtemp(prefix="protege-import-")) / f"{name}.validation.json"
            report_path.write_text(json.dumps(report, indent=2, default=str))
            notes = {s: e for s, e in zip(df["source"], df["parse_error"]) if e}
            notes.update({s: n for s, n, ok in zip(df["source"], df["image_note"], df["parsed"]) if n and ok})
            lines = [f.line() for f in failures]
            details = [f"  {s}: {n}" for s, n in list(notes.items())[:10]]
            raise DatasetInvalid(f"{shown}: {len(failures)} expectation(s) failed; nothing written to "
                                 f"{shown_out or out_dir} "
                                 f"(report: {report_path})\n"
                                 + "\n".join(lines + (["details:"] + details if details else [])))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return StagedSplit(name, df, report, staging, staged, len(frame), dropped)


TABLE_COLUMNS = ["id", "split", "kind", "question", "answer", "candidates", "options", "image", "extra_images",
                 "image_sha256", "difficulty", "target", "source"]


def candidates_of(options_json: str) -> str:
    """A multiple-choice row's short answers are its option letters (the judge reads among them)."""
    options = json.loads(options_json) if options_json else []
    return json.dumps(list(OPTION_LETTERS[:len(options)]))


def write_table(split: StagedSplit, out_dir: Path) -> ImportResult:
    """Moves a staged split's images under OUT/images (each once: a file already there is the same content)
    and writes OUT/NAME.parquet and OUT/NAME.validation.json."""
    try:
        (out_dir / "images").mkdir(parents=True, exist_ok=True)
        written = 0
        for rel in split.staged:
            if not (out_dir / rel).exists():
                shutil.move(str(split.staging / rel), str(out_dir / rel))
                written += 1
    finally:
        shutil.rmtree(split.staging, ignore_errors=True)
    split.report["images_written"] = written
    df = split.rows
    df = df.assign(split=split.name, difficulty=0, candidates=[candidates_of(o) for o in df["options"]],
                   target=[t if isinstance(t, str) and t and t != a else None for t, a in zip(df["target"], df["answer"])])
    table = out_dir / f"{split.name}.parquet"
    write_atomic(table, lambda tmp: df[TABLE_COLUMNS].to_parquet(tmp, index=False))
    report_path = out_dir / f"{split.name}.validation.json"
    write_atomic(report_path, lambda tmp: tmp.write_text(json.dumps(split.report, indent=2, default=str)))
    return ImportResult(table, report_path, split.rows_read, len(df), split.dropped, written)
