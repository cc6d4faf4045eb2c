"""Importers for user datasets: LLaVA-style conversations (JSON / JSONL) and parquet tables.

Both produce the question-row schema (protege.data.schemas): one row per (image, question) turn, images
copied once under OUT/images/<sha256>.<ext>, rows deduplicated by (image hash, question). Every source
row is kept long enough to be validated, so a bad row is reported by its file and line, not skipped in
silence; a table that fails its suite is not written (only its validation report is).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from protege.data.image_bytes import sniff_ext
from protege.data.schemas import QUESTION_ROWS
from protege.data.validate import (
    DatasetInvalid,
    answer_in_options,
    image_checks,
    run_suite,
)

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


def _image_bytes(value, image_root: Path) -> tuple[bytes | None, str]:
    """Bytes of an image given as a path, a data URL, raw base64, bytes, or a {'bytes'|'path'} dict."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None, "no image given"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), ""
    if not isinstance(value, str) or not value.strip():
        return None, "no image given"
    value = value.strip()
    if value.startswith("data:"):
        try:
            return base64.b64decode(value.split(",", 1)[1], validate=True), ""
        except (binascii.Error, IndexError):
            return None, "data URL is not valid base64"
    path = Path(value) if Path(value).is_absolute() else image_root / value
    if len(value) < 1024 and path.exists():
        return path.read_bytes(), ""
    if len(value) >= 64 and re.fullmatch(r"[A-Za-z0-9+/=\s]+", value):
        try:
            return base64.b64decode(value, validate=False), ""
        except binascii.Error:
            pass
    return None, f"image file not found: {path}"


def _turns(conversations) -> list[tuple[str, str]]:
    """(question, answer) for each human turn followed by an assistant turn."""
    pairs, pending = [], None
    for msg in conversations or []:
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
                out.append((label, rec if isinstance(rec, dict) else None, "" if isinstance(rec, dict) else "not an object"))
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
        turns = _turns(rec.get("conversations") or rec.get("messages"))
        image = rec.get("image") if rec.get("image") is not None else (rec.get("images") or [None])[0]
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
    df = pd.read_parquet(path)
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
    return out


def materialise(frame: pd.DataFrame, image_root: Path, out_dir: Path) -> tuple[pd.DataFrame, int, int]:
    """Writes images by content hash, resolves paths, adds the derived check columns, deduplicates."""
    images = out_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    written: set[str] = set()
    paths, hashes, notes = [], [], []
    for value in frame["image_value"]:
        data, note = _image_bytes(value, image_root)
        if data is None:
            paths.append("")
            hashes.append("")
            notes.append(note)
            continue
        digest = hashlib.sha256(data).hexdigest()
        rel = f"images/{digest}{sniff_ext(data)}"
        if digest not in written and not (out_dir / rel).exists():
            (out_dir / rel).write_bytes(data)
            written.add(digest)
        paths.append(rel)
        hashes.append(digest)
        notes.append("")
    df = frame.drop(columns=["image_value"]).assign(image=paths, image_sha256=hashes, image_note=notes)
    before = len(df)
    # identical (image, question) pairs are one example; rows without a parse are kept for the report
    key = df["image_sha256"] + "\x00" + df["question"].fillna("").astype(str)
    dup = key.duplicated() & df["parsed"] & (df["image_sha256"] != "")
    df = df[~dup].reset_index(drop=True)
    table = out_dir / "table.parquet"  # image paths are relative to the table's folder, i.e. out_dir
    checks = [image_checks(table, rel) if rel else (False, True) for rel in df["image"]]
    df["image_readable"] = [c[0] for c in checks]
    df["image_size_ok"] = [c[1] for c in checks]
    df["answer_in_options"] = [answer_in_options(a, o) for a, o in zip(df["answer"], df.get("options", ""))]
    for col in ("question", "answer"):
        df[col] = df[col].map(lambda v: v.strip() if isinstance(v, str) else v)
    return df, before - len(df), len(written)


def import_dataset(path: str | Path, fmt: str, out_dir: str | Path, name: str,
                   image_root: str | Path | None = None) -> ImportResult:
    """Imports, validates and writes OUT/NAME.parquet (+ OUT/NAME.validation.json); raises on a bad dataset."""
    path, out_dir = Path(path), Path(out_dir)
    if not path.exists():
        raise DatasetInvalid(f"{path}: file not found")
    image_root = Path(image_root) if image_root else path.parent
    readers = {"llava": conversations_frame, "parquet": parquet_frame}
    if fmt not in readers:
        raise DatasetInvalid(f"unknown format {fmt!r}; expected one of {sorted(readers)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = readers[fmt](path, image_root)
    rows_read = len(frame)
    df, dropped, n_images = materialise(frame, image_root, out_dir)
    report, failures = run_suite({str(path): df}, QUESTION_ROWS)
    report.update({"rows_read": rows_read, "duplicates_dropped": dropped, "images_written": n_images})
    report_path = out_dir / f"{name}.validation.json"
    report_path.write_text(json.dumps(report, indent=2, default=str))
    if failures:
        notes = {s: e for s, e in zip(df["source"], df["parse_error"]) if e}
        notes.update({s: n for s, n, ok in zip(df["source"], df["image_note"], df["parsed"]) if n and ok})
        lines = [f.line() for f in failures]
        details = [f"  {s}: {n}" for s, n in list(notes.items())[:10]]
        raise DatasetInvalid(f"{path}: {len(failures)} expectation(s) failed; nothing written "
                             f"(report: {report_path})\n" + "\n".join(lines + (["details:"] + details if details else [])))
    table = out_dir / f"{name}.parquet"
    columns = ["id", "question", "answer", "image", "image_sha256", "kind", "options", "source"]
    df = df.assign(candidates="[]", split=name, difficulty=0)
    df[columns + ["candidates", "split", "difficulty"]].to_parquet(table, index=False)
    return ImportResult(table, report_path, rows_read, len(df), dropped, n_images)
