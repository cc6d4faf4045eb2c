"""Content-addressed cache of teacher answers: never asks a teacher the same thing twice.

Key = sha256(teacher id + revision, rendered prompt, image hashes, sampling params, sample index).
Layout: ROOT/<teacher>/shard-NNNNNN.parquet, each written to a temp file and renamed (so a shard is
whole or absent), plus ROOT/<teacher>/index.json with every shard's sha256 and row count. Each shard
also carries, in its parquet metadata, its teacher and a digest of its answers. On load a shard whose
bytes do not match the index, or that does not parse, is moved to ROOT/<teacher>/corrupt/ and its keys
count as missing, so they are requested again. A shard missing from the index (a kill between the two
renames, or an index deleted or malformed, which is then rebuilt) is adopted only if its metadata
proves the cache wrote it for this teacher and its answers are unedited; any other parquet file in the
folder is quarantined the same way.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import threading
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from protege.errors import UserFacingError
from protege.files import file_sha256, write_atomic
from protege.teachers.backends import Outcome, TeacherAnswer, TeacherBackend, TeacherFailure, TeacherRequest

COLUMNS = ["key", "teacher", "revision", "question_id", "sample_index", "answer", "latency_s", "prompt_tokens",
           "completion_tokens", "finish_reason", "truncated"]
INDEX = "index.json"
SHARD_NAME = re.compile(r"shard-(\d{6,})\.parquet")


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


def _content_digest(df: pd.DataFrame) -> str:
    """A digest of a shard's answers, stored inside the shard: the cache adopts a shard without an index
    entry only if it carries this and its rows still match it."""
    rows = df[["key", "teacher", "revision", "question_id", "sample_index", "answer"]].astype(str).values.tolist()
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


_SHARD_META = b"protege.teacher_cache"


def _write_shard(path: Path, df: pd.DataFrame, teacher: str) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[_SHARD_META] = json.dumps({"teacher": teacher, "content_sha256": _content_digest(df)}).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)


def _read_own_shard(path: Path, teacher: str) -> pd.DataFrame:
    """A shard this cache wrote for `teacher`; ValueError for anything else (a foreign or edited file)."""
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(_SHARD_META)
    if raw is None:
        raise ValueError("not a shard written by protege's teacher cache (no cache metadata)")
    meta = json.loads(raw)
    df = table.to_pandas()
    if list(df.columns) != COLUMNS:
        raise ValueError(f"columns {list(df.columns)}; a shard has {COLUMNS}")
    if meta.get("teacher") != teacher or set(df["teacher"].astype(str)) - {teacher}:
        raise ValueError(f"written for teacher {meta.get('teacher')!r}, not {teacher!r}")
    if meta.get("content_sha256") != _content_digest(df):
        raise ValueError("its answers differ from what the cache wrote (edited)")
    return df


SHOW_ANSWERS = 5


def _answers_in(shard: Path) -> pd.DataFrame | None:
    """The keys and question/sample of each answer a rejected shard held, when its rows can still be read."""
    try:
        return pd.read_parquet(shard, columns=["key", "question_id", "sample_index"])
    except Exception:  # noqa: BLE001 -- torn or foreign bytes: which answers it held is unknown
        return None


def _quarantine_line(shard: Path, moved_to: Path, why: str, held: pd.DataFrame | None, kept: set) -> str:
    if held is None:
        again = "the answers it held (unreadable) will be asked again"
    else:
        lost = held[~held["key"].astype(str).isin(kept)]
        names = [f"{q} sample {i}" for q, i in zip(lost["question_id"].astype(str), lost["sample_index"].astype(str))]
        more = f" and {len(names) - SHOW_ANSWERS} more" if len(names) > SHOW_ANSWERS else ""
        again = (f"{len(names)} answer(s) will be asked again: " + ", ".join(names[:SHOW_ANSWERS]) + more
                 if names else "every answer it held is in another shard")
    return f"teacher cache: {shard} rejected ({why}); moved to {moved_to}; {again}"


class TeacherCache:
    def __init__(self, root: Path, flush_every: int = 128):
        self.root = Path(root)
        self.flush_every = flush_every
        self.root.mkdir(parents=True, exist_ok=True)
        # one line per shard this cache moved to corrupt/ or index it rebuilt, for the stage's report
        self.recovered: list[str] = []

    def _report(self, line: str) -> None:
        self.recovered.append(line)
        print(line)

    def folder(self, teacher: str) -> Path:
        return self.root / teacher

    # ---- reading -------------------------------------------------------------------------------------
    def _index(self, teacher: str) -> dict:
        """The index, or an empty one when it is missing or malformed (it is then rebuilt from the shards
        that prove they were written by this cache)."""
        p = self.folder(teacher) / INDEX
        if not p.exists():
            if any(self.folder(teacher).glob("*.parquet")):
                self._report(f"teacher cache: {p} is missing; rebuilding it from the shards that prove they are "
                             "the cache's own")
                return {"shards": {}, "rebuilt": True}
            return {"shards": {}}
        try:
            index = json.loads(p.read_text(encoding="utf-8"))
            shards = index["shards"]
            if not isinstance(shards, dict) or not all(
                    isinstance(k, str) and SHARD_NAME.fullmatch(k) and isinstance(v, dict)
                    and isinstance(v.get("sha256"), str) and isinstance(v.get("rows"), int) for k, v in shards.items()):
                raise ValueError("'shards' is not a map of shard-NNNNNN.parquet -> {sha256, rows}")
            return {"shards": dict(shards)}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            self._report(f"teacher cache: {p} is malformed ({type(exc).__name__}: {exc}); rebuilding it from the "
                         "shards")
            return {"shards": {}, "rebuilt": True}

    def _write_index(self, teacher: str, index: dict) -> None:
        write_atomic(self.folder(teacher) / INDEX, lambda p: p.write_text(json.dumps(index, indent=1)))

    def load(self, teacher: str) -> pd.DataFrame:
        """Every stored answer of a teacher, one row per key; quarantines corrupt shards."""
        folder = self.folder(teacher)
        if not folder.exists():
            return pd.DataFrame(columns=COLUMNS)
        index = self._index(teacher)
        for stale in folder.glob(".*.tmp"):  # a write killed before its rename: never part of the cache
            stale.unlink()
        frames, changed, rejected = [], bool(index.pop("rebuilt", False)), []
        for shard in sorted(folder.glob("*.parquet")):
            entry = index["shards"].get(shard.name)
            digest = file_sha256(shard)
            try:
                if not SHARD_NAME.fullmatch(shard.name):
                    raise ValueError("not named like a cache shard (shard-NNNNNN.parquet)")
                if entry is not None and entry["sha256"] != digest:
                    raise ValueError("checksum differs from the index")
                if entry is not None:
                    df = pd.read_parquet(shard)
                    if len(df) != entry["rows"]:
                        raise ValueError("row count differs from the index")
                else:  # not in the index: adopted only if it proves it is one of ours, unedited
                    df = _read_own_shard(shard, teacher)
            except Exception as exc:  # torn, truncated, edited or foreign: its keys will be asked again
                held = _answers_in(shard)
                (folder / "corrupt").mkdir(exist_ok=True)
                moved_to = folder / "corrupt" / shard.name
                os.replace(shard, moved_to)
                index["shards"].pop(shard.name, None)
                changed = True
                rejected.append((shard, moved_to, str(exc), held))
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
        kept = {str(k) for f in frames for k in f["key"]}
        for shard, moved_to, why, held in rejected:
            self._report(_quarantine_line(shard, moved_to, why, held, kept))
        if not frames:
            return pd.DataFrame(columns=COLUMNS)
        return pd.concat(frames, ignore_index=True).drop_duplicates("key", keep="first").reset_index(drop=True)

    # ---- writing -------------------------------------------------------------------------------------
    def _append_shard(self, teacher: str, rows: list[dict], index: dict) -> None:
        """Writes one new shard, then the index that lists it (both atomic)."""
        folder = self.folder(teacher)
        folder.mkdir(parents=True, exist_ok=True)
        taken = [int(SHARD_NAME.fullmatch(name).group(1)) for name in index["shards"]]
        shard = folder / f"shard-{max(taken, default=-1) + 1:06d}.parquet"
        write_atomic(shard, lambda p: _write_shard(p, pd.DataFrame(rows, columns=COLUMNS), teacher))
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
