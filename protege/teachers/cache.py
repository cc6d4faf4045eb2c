"""Content-addressed cache of teacher answers: never asks a teacher the same thing twice.

Key = sha256(teacher id + revision, rendered prompt, image hashes, sampling params, sample index).
Layout: ROOT/<teacher>/shard-NNNNNN.parquet, each written to a temp file and renamed (so a shard is
whole or absent), plus ROOT/<teacher>/index.json with every shard's sha256 and row count. Each shard
also carries, in its parquet metadata, its teacher and a digest of its answers. On load a shard whose
bytes do not match the index, or that does not parse, is moved to ROOT/<teacher>/corrupt/ and its keys
count as missing, so they are requested again. A shard missing from the index (a kill between the two
renames, or an index deleted or malformed, which is then rebuilt) is adopted only if its metadata
proves the cache wrote it for this teacher and its answers are unedited; any other parquet file in the
folder is quarantined the same way. Each such repair is recorded as a `Repair` in `TeacherCache.repairs`
(the file, why it was distrusted, which answers were dropped and how many a fill asked again); the cache
prints nothing itself: the `teachers` stage prints one line per repair and counts them in its metrics.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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
    """A shard this cache wrote for `teacher`; _Distrusted for anything else (a torn, foreign or edited file)."""
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 -- torn or not parquet at all
        raise _Distrusted("unreadable", f"{type(exc).__name__}: {exc}") from exc
    raw = (table.schema.metadata or {}).get(_SHARD_META)
    if raw is None:
        raise _Distrusted("no digest", "not a shard written by protege's teacher cache (no cache metadata)")
    meta = json.loads(raw)
    df = table.to_pandas()
    if list(df.columns) != COLUMNS:
        raise _Distrusted("foreign", f"columns {list(df.columns)}; a shard has {COLUMNS}")
    if meta.get("teacher") != teacher or set(df["teacher"].astype(str)) - {teacher}:
        raise _Distrusted("foreign", f"written for teacher {meta.get('teacher')!r}, not {teacher!r}")
    if meta.get("content_sha256") != _content_digest(df):
        raise _Distrusted("digest mismatch", "its answers differ from what the cache wrote (edited)")
    return df


SHOW_ANSWERS = 5


class _Distrusted(ValueError):
    """A shard that failed a check: `reason` is the short label a Repair carries, the message the check."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class Repair:
    """One repair the cache made while loading a teacher's answers: an index it rebuilt, or a shard it
    distrusted and moved to corrupt/. Paths are relative to the cache folder (e.g. concise/shard-000001.parquet)."""

    teacher: str
    file: str
    reason: str          # index missing | index malformed | digest mismatch | row count mismatch | unreadable
    #                      | no digest (rewritten by another tool, or never the cache's) | foreign | misnamed
    detail: str = ""     # the check that failed, in words
    moved_to: str | None = None          # where a distrusted shard went (relative to the cache folder)
    dropped: int | None = None           # answers lost with it (not held by another shard); unreadable: the
    #                                      index's row count, or None when the index did not list it
    dropped_answers: list[str] = field(default_factory=list)   # "q3 sample 0", ... of those answers
    dropped_keys: list[str] = field(default_factory=list)
    reasked_keys: set[str] | None = None  # of those, the ones a fill asked the teacher for again; None: no fill yet
    adopted: int = 0                     # an index rebuilt: the shards it now lists

    @property
    def is_index(self) -> bool:
        return self.reason.startswith("index")

    @property
    def re_asked(self) -> int | None:
        return None if self.reasked_keys is None else len(self.reasked_keys)

    def line(self, folder: str | Path = "") -> str:
        """What happened, in one line; `folder` (the cache folder as the reader knows it) prefixes the paths."""
        where = lambda rel: str(Path(folder) / rel) if str(folder) else rel  # noqa: E731
        if self.is_index:
            why = self.reason.removeprefix("index ") + (f" ({self.detail})" if self.detail else "")
            adopted = ("from 0 shards (none proves it is the cache's own)" if self.adopted == 0 else
                       "from 1 shard that proves it is the cache's own" if self.adopted == 1 else
                       f"from {self.adopted} shards that prove they are the cache's own")
            return f"cache index {where(self.file)} {why}: rebuilt {adopted}"
        head = f"cache shard {where(self.file)} distrusted ({self.reason}: {self.detail})"
        tail = f"; moved to {where(self.moved_to)}" if self.moved_to else ""
        if self.dropped is None or len(self.dropped_keys) != self.dropped:
            held = ("its answers could not be read" if self.dropped is None else
                    f"{_plural(self.dropped, 'answer')} dropped (unreadable, so which ones is unknown)")
            return f"{head}: {held}; any this run wants that no other shard holds are asked again{tail}"
        if self.dropped == 0:
            return f"{head}: nothing dropped, every answer it held is in another shard{tail}"
        more = f" and {self.dropped - SHOW_ANSWERS} more" if self.dropped > SHOW_ANSWERS else ""
        lost = f"{_plural(self.dropped, 'answer')} dropped ({', '.join(self.dropped_answers[:SHOW_ANSWERS])}{more})"
        if self.re_asked is None:
            again = "asked again when next wanted"
        elif self.re_asked == self.dropped:
            again = "re-asked" if self.dropped == 1 else f"all {self.dropped} re-asked"
        else:
            again = f"{self.re_asked} re-asked ({self.dropped - self.re_asked} not wanted by this run)"
        return f"{head}: {lost}, {again}{tail}"


def repair_counts(repairs: Iterable[Repair]) -> dict[str, int]:
    """What a stage logs about its cache's repairs (all 0 for a healthy cache)."""
    repairs = list(repairs)
    shards = [r for r in repairs if not r.is_index]
    return {"cache_shards_repaired": len(shards),
            "cache_indexes_rebuilt": sum(r.is_index for r in repairs),
            "cache_answers_dropped": sum(r.dropped or 0 for r in shards),
            "cache_answers_reasked": sum(r.re_asked or 0 for r in shards)}


def _answers_in(shard: Path) -> pd.DataFrame | None:
    """The keys and question/sample of each answer a rejected shard held, when its rows can still be read."""
    try:
        return pd.read_parquet(shard, columns=["key", "question_id", "sample_index"])
    except Exception:  # noqa: BLE001 -- torn or foreign bytes: which answers it held is unknown
        return None


class TeacherCache:
    def __init__(self, root: Path, flush_every: int = 128):
        self.root = Path(root)
        self.flush_every = flush_every
        self.root.mkdir(parents=True, exist_ok=True)
        # every index this cache rebuilt and shard it moved to corrupt/, in order, for the stage's report
        self.repairs: list[Repair] = []

    @property
    def recovered(self) -> list[str]:
        """One line per repair (paths relative to the cache folder)."""
        return [r.line() for r in self.repairs]

    def folder(self, teacher: str) -> Path:
        return self.root / teacher

    # ---- reading -------------------------------------------------------------------------------------
    def _index(self, teacher: str) -> dict:
        """The index, or an empty one when it is missing or malformed (it is then rebuilt from the shards
        that prove they were written by this cache; "rebuilt" then holds the Repair that says so)."""
        p = self.folder(teacher) / INDEX
        rel = f"{teacher}/{INDEX}"
        if not p.exists():
            if any(self.folder(teacher).glob("*.parquet")):
                return {"shards": {}, "rebuilt": Repair(teacher, rel, "index missing")}
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
            return {"shards": {}, "rebuilt": Repair(teacher, rel, "index malformed", f"{type(exc).__name__}: {exc}")}

    def _write_index(self, teacher: str, index: dict) -> None:
        write_atomic(self.folder(teacher) / INDEX, lambda p: p.write_text(json.dumps(index, indent=1)))

    def load(self, teacher: str) -> pd.DataFrame:
        """Every stored answer of a teacher, one row per key; quarantines corrupt shards and records each
        repair in `self.repairs`."""
        folder = self.folder(teacher)
        if not folder.exists():
            return pd.DataFrame(columns=COLUMNS)
        index = self._index(teacher)
        for stale in folder.glob(".*.tmp"):  # a write killed before its rename: never part of the cache
            stale.unlink()
        rebuilt = index.pop("rebuilt", None)
        frames, changed, rejected = [], rebuilt is not None, []
        for shard in sorted(folder.glob("*.parquet")):
            entry = index["shards"].get(shard.name)
            digest = file_sha256(shard)
            try:
                if not SHARD_NAME.fullmatch(shard.name):
                    raise _Distrusted("misnamed", "not named like a cache shard (shard-NNNNNN.parquet)")
                if entry is not None and entry["sha256"] != digest:
                    raise _Distrusted("digest mismatch", "checksum differs from the index")
                if entry is not None:
                    try:
                        df = pd.read_parquet(shard)
                    except Exception as exc:  # noqa: BLE001 -- torn bytes behind a matching checksum
                        raise _Distrusted("unreadable", f"{type(exc).__name__}: {exc}") from exc
                    if len(df) != entry["rows"]:
                        raise _Distrusted("row count mismatch", "row count differs from the index")
                else:  # not in the index: adopted only if it proves it is one of ours, unedited
                    df = _read_own_shard(shard, teacher)
            except Exception as exc:  # torn, truncated, edited or foreign: its keys will be asked again
                held = _answers_in(shard)
                (folder / "corrupt").mkdir(exist_ok=True)
                moved_to = folder / "corrupt" / shard.name
                os.replace(shard, moved_to)
                index["shards"].pop(shard.name, None)
                changed = True
                reason = exc.reason if isinstance(exc, _Distrusted) else "unreadable"
                rejected.append((shard, moved_to, reason, str(exc), held, entry))
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
        if rebuilt is not None:
            rebuilt.adopted = len(index["shards"])
            self.repairs.append(rebuilt)
        kept = {str(k) for f in frames for k in f["key"]}
        for shard, moved_to, reason, why, held, entry in rejected:
            repair = Repair(teacher, shard.relative_to(self.root).as_posix(), reason, why,
                            moved_to.relative_to(self.root).as_posix())
            if held is None:  # which answers it held is unknown; how many, only if the index listed it
                repair.dropped = entry["rows"] if entry is not None else None
            else:
                lost = held[~held["key"].astype(str).isin(kept)]
                repair.dropped = len(lost)
                repair.dropped_keys = lost["key"].astype(str).tolist()
                repair.dropped_answers = [f"{q} sample {i}" for q, i in zip(lost["question_id"].astype(str),
                                                                             lost["sample_index"].astype(str))]
            self.repairs.append(repair)
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

    def fill(self, backend: TeacherBackend, requests: list[TeacherRequest],
             progress: Callable[[int, int], None] | None = None) -> dict:
        """Asks the backend for the keys not cached yet, persisting a shard every `flush_every` answers.
        `progress(done, total)` after each answer or failure, over the keys asked now.

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
        for repair in self.repairs:  # what a repair dropped and this fill wants is asked again: say how much
            if repair.teacher == backend.name and not repair.is_index and repair.dropped == len(repair.dropped_keys):
                repair.reasked_keys = (repair.reasked_keys or set()) | seen.intersection(repair.dropped_keys)
        by_key = {r.key: r for r in missing}
        buffer: list[dict] = []
        failures: list[TeacherFailure] = []
        answers: list[TeacherAnswer] = []
        lock = threading.Lock()

        def flush() -> None:
            if buffer:
                self._append_shard(backend.name, buffer[:], index)
                buffer.clear()

        def keep(o: Outcome) -> None:
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

        def on_outcome(o: Outcome) -> None:
            with lock:
                keep(o)
                if progress is not None:
                    progress(len(answers) + len(failures), len(missing))

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
