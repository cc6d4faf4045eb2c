"""Importers for user datasets: LLaVA-style conversations (JSON / JSONL) and parquet tables.

Both produce the question-row schema (protege.data.schemas): one row per (image, question) turn, images
copied once under OUT/images/<sha256>.<ext>, rows deduplicated by (image hash, question). Every source
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
from protege.data.schemas import QUESTION_ROWS
from protege.data.validate import (
    DatasetInvalid,
    answer_in_options,
    image_bytes_checks,
    run_suite,
)
from protege.files import write_atomic

MAX_IMAGE_FILE_BYTES = 256 * 1024 * 1024  # a larger file is a mistake, not a training image
IMAGE_PLACEHOLDER = re.compile(r"\s*<image>\s*")
HUMAN, ASSISTANT = {"human", "user"}, {"gpt", "assistant", "model"}


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


def _turns(conversations) -> list[tuple[str, str]]:
    """(question, answer) for each human turn followed by an assistant turn; ValueError for a shape
    that is not a list of turn objects."""
    if conversations is None:
        return []
    if not isinstance(conversations, list):
        raise ValueError(f"'conversations' is a {type(conversations).__name__}; expected a list of "
                         "{\"from\": ..., \"value\": ...} turns")
    pairs, pending = [], None
    for n, msg in enumerate(conversations):
        if not isinstance(msg, dict):
            raise ValueError(f"conversations[{n}] is a {type(msg).__name__}; expected an object with 'from' and "
                             "'value'")
        who = str(msg.get("from", msg.get("role", ""))).lower()
        text = msg.get("value", msg.get("content", ""))
        text = text if isinstance(text, str) else ""
        if who in HUMAN:
            pending = IMAGE_PLACEHOLDER.sub(" ", text).strip()
        elif who in ASSISTANT and pending is not None:
            pairs.append((pending, text.strip()))
            pending = None
    return pairs


def _read_conversation_records(path: Path) -> list[tuple[str, dict | None, str]]:
    """(source label, record or None, parse error) for every record of a JSON or JSONL file."""
    raw = path.read_bytes()
    if path.suffix == ".jsonl":
        out = []
        for n, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            label = f"{path.name}:{n}"
            try:
                rec = json.loads(line.decode("utf-8"))
                ok = isinstance(rec, dict)
                out.append((label, rec if ok else None, "" if ok else "not an object"))
            except UnicodeDecodeError as exc:
                out.append((label, None, f"not UTF-8 (byte {exc.start})"))
            except json.JSONDecodeError as exc:
                out.append((label, None, f"not JSON ({exc.msg})"))
        return out
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DatasetInvalid(f"{path}: not UTF-8 at byte {exc.start}; expected a UTF-8 JSON list of records") from None
    except json.JSONDecodeError as exc:
        raise DatasetInvalid(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, list):
        raise DatasetInvalid(f"{path}: expected a JSON list of conversation records, got {type(data).__name__}")
    return [(f"{path.name}:record {i}", rec if isinstance(rec, dict) else None,
             "" if isinstance(rec, dict) else "not an object") for i, rec in enumerate(data)]


def conversations_frame(path: Path, image_root: Path) -> pd.DataFrame:
    rows = []
    for label, rec, error in _read_conversation_records(path):
        if rec is None:
            rows.append({"id": None, "question": None, "answer": None, "image_value": None, "source": label,
                         "parsed": False, "parse_error": error})
            continue
        image = rec.get("image") if rec.get("image") is not None else (rec.get("images") or [None])[0]
        try:
            turns = _turns(rec["conversations"] if "conversations" in rec else rec.get("messages"))
        except ValueError as exc:
            rows.append({"id": rec.get("id"), "question": None, "answer": None, "image_value": image, "source": label,
                         "parsed": False, "parse_error": str(exc)})
            continue
        if isinstance(image, list):
            image = image[0] if image else None
        if not turns:
            rows.append({"id": rec.get("id"), "question": None, "answer": None, "image_value": image, "source": label,
                         "parsed": False, "parse_error": "no human/assistant turn pair"})
        for t, (q, a) in enumerate(turns):
            rid = str(rec.get("id")) if rec.get("id") is not None else None
            rows.append({"id": rid if len(turns) == 1 or rid is None else f"{rid}#t{t}", "question": q, "answer": a,
                         "image_value": image, "source": label, "parsed": True, "parse_error": "",
                         "options": json.dumps(rec.get("options") or []), "kind": str(rec.get("kind", ""))})
    return pd.DataFrame(rows)


def parquet_frame(path: Path, image_root: Path) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for bytes that are not parquet
        raise DatasetInvalid(f"{path}: not a readable parquet table ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); expected a parquet file") from None
    missing = [c for c in ("id", "question", "answer", "image") if c not in df.columns]
    if missing:
        raise DatasetInvalid(f"{path}: missing column(s) {missing}; expected id, question, answer, image "
                             "(image: a path, base64, bytes or a {{'bytes': ...}} struct)")
    out = pd.DataFrame({"id": df["id"].astype(str), "question": df["question"], "answer": df["answer"],
                        "image_value": df["image"], "source": [f"{path.name}:row {i}" for i in range(len(df))],
                        "parsed": True, "parse_error": ""})
    out["options"] = [json.dumps(list(o)) if o is not None and not isinstance(o, str) else (o or "[]")
                      for o in (df["options"] if "options" in df else [None] * len(df))]
    out["kind"] = df["kind"].astype(str) if "kind" in df else ""
    if "target" in df:  # optional: what SFT trains on when it is not the bare answer
        for i, value in enumerate(df["target"]):
            if value is not None and not (isinstance(value, float) and value != value) and not isinstance(value, str):
                raise DatasetInvalid(f"{path}: row {i}: column 'target' holds {type(value).__name__} {value!r}; "
                                     "expected the SFT target as text (or null: the answer)")
        out["target"] = [v if isinstance(v, str) and v else None for v in df["target"]]
    return out


def materialise(frame: pd.DataFrame, image_root: Path, staging: Path, allow_outside: bool = False
                ) -> tuple[pd.DataFrame, int, list[str]]:
    """Checks every image and writes the good ones, once each, under `staging` (not the output folder);
    adds the derived check columns; deduplicates. Returns (rows, duplicates dropped, staged paths)."""
    staged: list[str] = []
    paths, hashes, notes, readable, size_ok = [], [], [], [], []
    for value in frame["image_value"]:
        data, note = _image_bytes(value, image_root, allow_outside)
        if data is None:
            paths.append("")
            hashes.append("")
            notes.append(note)
            readable.append(False)
            size_ok.append(True)
            continue
        decodes, fits, why = image_bytes_checks(data)
        digest = hashlib.sha256(data).hexdigest()
        rel = f"images/{digest}{sniff_ext(data)}"
        if decodes and fits and not (staging / rel).exists():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_bytes(data)
            staged.append(rel)
        paths.append(rel)
        hashes.append(digest)
        notes.append(why)
        readable.append(decodes)
        size_ok.append(fits)
    df = frame.drop(columns=["image_value"]).assign(image=paths, image_sha256=hashes, image_note=notes,
                                                    image_readable=readable, image_size_ok=size_ok)
    before = len(df)
    # identical (image, question) pairs are one example; rows without a parse are kept for the report
    key = df["image_sha256"] + "\x00" + df["question"].fillna("").astype(str)
    dup = key.duplicated() & df["parsed"] & (df["image_sha256"] != "")
    df = df[~dup].reset_index(drop=True)
    options = df["options"] if "options" in df else [""] * len(df)
    df["answer_in_options"] = [answer_in_options(a, o) for a, o in zip(df["answer"], options)]
    for col in ("question", "answer"):
        df[col] = df[col].map(lambda v: v.strip() if isinstance(v, str) else v)
    return df, before - len(df), staged


def import_dataset(path: str | Path, fmt: str, out_dir: str | Path, name: str,
                   image_root: str | Path | None = None, allow_outside_images: bool = False) -> ImportResult:
    """Imports and validates a dataset, then writes OUT/NAME.parquet, OUT/images/ and
    OUT/NAME.validation.json. A rejected dataset writes nothing under OUT (its validation report goes
    to a temporary folder named in the error)."""
    path, out_dir = Path(path), Path(out_dir)
    if not path.exists():
        raise DatasetInvalid(f"{path}: file not found")
    if path.is_dir():
        raise DatasetInvalid(f"{path}: is a folder; expected a .json/.jsonl conversation file or a .parquet table")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise DatasetInvalid(f"table name {name!r}: use letters, digits, '_', '.' and '-' only")
    image_root = Path(image_root) if image_root else path.parent
    if not image_root.is_dir():
        raise DatasetInvalid(f"{image_root}: the images folder does not exist")
    readers = {"llava": conversations_frame, "parquet": parquet_frame}
    if fmt not in readers:
        raise DatasetInvalid(f"unknown format {fmt!r}; expected one of {sorted(readers)}")
    if out_dir.exists() and not out_dir.is_dir():
        raise DatasetInvalid(f"{out_dir}: exists and is not a folder")
    frame = readers[fmt](path, image_root)
    if frame.empty:
        raise DatasetInvalid(f"{path}: no rows; expected at least one "
                             + ("conversation record" if fmt == "llava" else "row after the header"))
    rows_read = len(frame)
    # images wait in a staging folder beside OUT (same file system: moved, not copied) until all passes
    parent = next((p for p in [out_dir.parent, *out_dir.parent.parents] if p.is_dir()), Path.cwd())
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.import-", dir=parent))
    try:
        df, dropped, staged = materialise(frame, image_root, staging, allow_outside_images)
        report, failures = run_suite({str(path): df}, QUESTION_ROWS)
        report.update({"rows_read": rows_read, "duplicates_dropped": dropped, "images_written": 0})
        if failures:
            report_path = Path(tempfile.mkdtemp(prefix="protege-import-")) / f"{name}.validation.json"
            report_path.write_text(json.dumps(report, indent=2, default=str))
            notes = {s: e for s, e in zip(df["source"], df["parse_error"]) if e}
            notes.update({s: n for s, n, ok in zip(df["source"], df["image_note"], df["parsed"]) if n and ok})
            lines = [f.line() for f in failures]
            details = [f"  {s}: {n}" for s, n in list(notes.items())[:10]]
            raise DatasetInvalid(f"{path}: {len(failures)} expectation(s) failed; nothing written to {out_dir} "
                                 f"(report: {report_path})\n"
                                 + "\n".join(lines + (["details:"] + details if details else [])))
        (out_dir / "images").mkdir(parents=True, exist_ok=True)
        written = 0
        for rel in staged:
            if not (out_dir / rel).exists():
                shutil.move(str(staging / rel), str(out_dir / rel))
                written += 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report["images_written"] = written
    table = out_dir / f"{name}.parquet"
    columns = ["id", "question", "answer", "image", "image_sha256", "kind", "options", "source"]
    columns += ["target"] if "target" in df else []
    df = df.assign(candidates="[]", split=name, difficulty=0)
    write_atomic(table, lambda tmp: df[columns + ["candidates", "split", "difficulty"]].to_parquet(tmp, index=False))
    report_path = out_dir / f"{name}.validation.json"
    write_atomic(report_path, lambda tmp: tmp.write_text(json.dumps(report, indent=2, default=str)))
    return ImportResult(table, report_path, rows_read, len(df), dropped, written)
