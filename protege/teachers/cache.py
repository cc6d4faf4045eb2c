"""Content-addressed cache of teacher answers: never asks a teacher the same thing twice.

Key = sha256(teacher id + revision, rendered prompt, image hash, sampling params, sample index).
Storage is one parquet file per teacher, replaced atomically (temp file + rename), so a killed run
leaves either the old or the new file, never a torn one.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd

from protege.teachers.backends import TeacherBackend, TeacherRequest

COLUMNS = ["key", "teacher", "question_id", "sample_index", "answer", "latency_s", "finish_reason"]


def cache_key(teacher: str, revision: str, prompt: str, image_sha256: str, sampling: dict, sample_index: int) -> str:
    payload = json.dumps([teacher, revision, prompt, image_sha256, sampling, sample_index], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _write_atomic(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


class TeacherCache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, teacher: str) -> Path:
        return self.root / f"{teacher}.parquet"

    def load(self, teacher: str) -> pd.DataFrame:
        p = self.path(teacher)
        return pd.read_parquet(p) if p.exists() else pd.DataFrame(columns=COLUMNS)

    def fill(self, backend: TeacherBackend, requests: list[TeacherRequest], batch_size: int = 256) -> dict:
        """Requests only the keys not cached yet; persists after each batch so work survives a kill."""
        have = self.load(backend.name)
        known = set(have["key"])
        missing = [r for r in requests if r.key not in known]
        frames = [have]
        for i in range(0, len(missing), batch_size):
            chunk = missing[i:i + batch_size]
            answers = backend.answer(chunk)
            frames.append(pd.DataFrame([{"key": a.key, "teacher": backend.name, "question_id": r.question_id,
                                         "sample_index": r.sample_index, "answer": a.text,
                                         "latency_s": a.latency_s, "finish_reason": a.finish_reason}
                                        for r, a in zip(chunk, answers)], columns=COLUMNS))
            _write_atomic(pd.concat(frames, ignore_index=True), self.path(backend.name))
        if not missing and not self.path(backend.name).exists():
            _write_atomic(have, self.path(backend.name))
        return {"teacher": backend.name, "requested": len(missing), "cached": len(known), "total": len(requests)}
