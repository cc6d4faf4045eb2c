"""Content-addressed cache of teacher answers: never asks a teacher the same thing twice.

Key = sha256(teacher id + revision, rendered prompt, image hashes, sampling params, sample index).
Layout: ROOT/<teacher>/shard-NNNNNN.parquet, each written to a temp file and renamed (so a shard is
whole or absent), plus ROOT/<teacher>/index.json with every shard's sha256 and row count. On load a
shard whose bytes do not match the index, or that does not parse, is moved to ROOT/<teacher>/corrupt/
and its keys count as missing, so they are requested again. A shard that landed after the last index
write (a kill between the two renames) is verified by parsing and adopted.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import threading
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from protege.errors import UserFacingError
from protege.teachers.backends import Outcome, TeacherAnswer, TeacherBackend, TeacherFailure, TeacherRequest

COLUMNS = ["key", "teacher", "revision", "question_id", "sample_index", "answer", "latency_s", "prompt_tokens",
           "completion_tokens", "finish_reason", "truncated"]
INDEX = "index.json"


class TeacherCacheIncomplete(UserFacingError):
    """Some requests failed after their retries; everything received is already stored."""

    def __init__(self, teacher: str, missing: int, total: int, examples: list[str]):
        self.teacher, self.missing, self.total = teacher, missing, total
        super().__init__(f"teacher '{teacher}': {missing} of {total} answers still missing after retries "
                         f"(the {total - missing} received are cached; re-run to request only the missing). "
                         f"First errors: {'; '.join(examples[:3])}")


def cache_key(teacher: str, revision: str, prompt: str, image_hashes: Iterable[str] | str, sampling: dict,
              sample_index: int) -> str:
    hashes = [image_hashes] if isinstance(image_hashes, str) else list(image_hashes)
    payload = json.dumps([teacher, revision, prompt, hashes, sampling, sample_index], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class TeacherCache:
    def __init__(self, root: Path, flush_every: int = 128):
        self.root = Path(root)
        self.flush_every = flush_every
        self.root.mkdir(parents=True, exist_ok=True)

    def folder(self, teacher: str) -> Path:
        return self.root / teacher

    # ---- reading -------------------------------------------------------------------------------------
    def _index(self, teacher: str) -> dict:
        p = self.folder(teacher) / INDEX
        if not p.exists():
            return {"shards": {}}
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError:  # the index is rebuilt from the shards themselves
            return {"shards": {}}

    def _write_index(self, teacher: str, index: dict) -> None:
        _write_atomic(self.folder(teacher) / INDEX, lambda p: p.write_text(json.dumps(index, indent=1)))

    def load(self, teacher: str) -> pd.DataFrame:
        """Every stored answer of a teacher, one row per key; quarantines corrupt shards."""
        folder = self.folder(teacher)
        if not folder.exists():
            return pd.DataFrame(columns=COLUMNS)
        index = self._index(teacher)
        for stale in folder.glob(".*.tmp"):  # a write killed before its rename: never part of the cache
            stale.unlink()
        frames, changed = [], False
        for shard in sorted(folder.glob("shard-*.parquet")):
            entry = index["shards"].get(shard.name)
            digest = file_sha256(shard)
            try:
                if entry is not None and entry["sha256"] != digest:
                    raise ValueError("checksum differs from the index")
                df = pd.read_parquet(shard)
                if entry is not None and len(df) != entry["rows"]:
                    raise ValueError("row count differs from the index")
            except Exception as exc:  # torn, truncated or edited: its keys will be asked again
                (folder / "corrupt").mkdir(exist_ok=True)
                os.replace(shard, folder / "corrupt" / shard.name)
                index["shards"].pop(shard.name, None)
                changed = True
                print(f"teacher cache: {shard} is corrupt ({exc}); moved to corrupt/, its keys will be re-requested")
                continue
            if entry is None:
                index["shards"][shard.name] = {"sha256": digest, "rows": len(df)}
                changed = True
            frames.append(df)
        for name in list(index["shards"]):
            if not (folder / name).exists():
                index["shards"].pop(name)
                changed = True
        if changed:
            self._write_index(teacher, index)
        if not frames:
            return pd.DataFrame(columns=COLUMNS)
        return pd.concat(frames, ignore_index=True).drop_duplicates("key", keep="first").reset_index(drop=True)

    # ---- writing -------------------------------------------------------------------------------------
    def _append_shard(self, teacher: str, rows: list[dict], index: dict) -> None:
        """Writes one new shard, then the index that lists it (both atomic)."""
        folder = self.folder(teacher)
        folder.mkdir(parents=True, exist_ok=True)
        taken = [int(name.split("-")[1].split(".")[0]) for name in index["shards"]]
        shard = folder / f"shard-{max(taken, default=-1) + 1:06d}.parquet"
        _write_atomic(shard, lambda p: pd.DataFrame(rows, columns=COLUMNS).to_parquet(p, index=False))
        index["shards"][shard.name] = {"sha256": file_sha256(shard), "rows": len(rows)}
        self._write_index(teacher, index)

    def fill(self, backend: TeacherBackend, requests: list[TeacherRequest]) -> dict:
        """Asks the backend for the keys not cached yet, persisting a shard every `flush_every` answers.

        Raises TeacherCacheIncomplete (after storing every answer received) if some requests failed.
        """
        have = set(self.load(backend.name)["key"])
        index = self._index(backend.name)  # load() has just reconciled it with the shards on disk
        seen: set[str] = set()
        missing = []
        for r in requests:  # the same key twice in one call is asked once
            if r.key not in have and r.key not in seen:
                missing.append(r)
                seen.add(r.key)
        by_key = {r.key: r for r in missing}
        buffer: list[dict] = []
        failures: list[TeacherFailure] = []
        answers: list[TeacherAnswer] = []
        lock = threading.Lock()

        def flush() -> None:
            if buffer:
                self._append_shard(backend.name, buffer[:], index)
                buffer.clear()

        def on_outcome(o: Outcome) -> None:
            with lock:
                if isinstance(o, TeacherFailure):
                    failures.append(o)
                    return
                req = by_key[o.key]
                answers.append(o)
                buffer.append({"key": o.key, "teacher": backend.name, "revision": backend.revision,
                               "question_id": req.question_id, "sample_index": req.sample_index, "answer": o.text,
                               "latency_s": o.latency_s, "prompt_tokens": o.prompt_tokens,
                               "completion_tokens": o.completion_tokens, "finish_reason": o.finish_reason,
                               "truncated": o.finish_reason == "length"})
                if len(buffer) >= self.flush_every:
                    flush()

        try:
            if missing:
                backend.run(missing, on_outcome)
        finally:
            with lock:
                flush()  # whatever happened, answers received are kept
        stats = {"teacher": backend.name, "total": len(requests), "cached_before": len(requests) - len(missing),
                 "requested": len(missing), "received": len(answers), "failures": len(failures)}
        stats.update(latency_stats([a.latency_s for a in answers]))
        if failures:
            raise TeacherCacheIncomplete(backend.name, len(failures), len(missing), [f.error for f in failures])
        return stats


def latency_stats(latencies: list[float]) -> dict:
    if not latencies:
        return {"p50_latency_s": 0.0, "p95_latency_s": 0.0}
    qs = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) > 1 else [latencies[0]] * 19
    return {"p50_latency_s": statistics.median(latencies), "p95_latency_s": qs[18]}
