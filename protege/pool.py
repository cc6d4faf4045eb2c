"""The versioned pool of training data that retraining grows, and the inbox it grows from.

Files dropped in `data/incoming/` (LLaVA-style .json/.jsonl or .parquet; relative image paths resolve
inside `data/incoming/`) are imported one by one with the same importer and Great Expectations suite as
`protege data import`. An accepted file becomes one batch folder `data/pool/<sha256 of the file>/`
(train.parquet, images/, its validation report, batch.json); the file itself moves to
`data/archive/<run id>/`. A rejected file moves to `data/rejected/<run id>/` with `<name>.report.json`
naming the row and field. A batch is named by the file's content, so a file admitted twice (a crash between
the import and the move, or a user dropping it again) is one batch. DVC versions the pool as a whole
(`data/pool.dvc`); `sft` trains on the world's train split plus every batch.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

POOL = Path("data/pool")
INCOMING = Path("data/incoming")
REJECTED = Path("data/rejected")
ARCHIVE = Path("data/archive")
SUFFIXES = {".json": "llava", ".jsonl": "llava", ".parquet": "parquet"}
BATCH_TABLE = "train.parquet"


@dataclass
class Admission:
    accepted: list[str] = field(default_factory=list)     # batch folder names, in the order admitted
    already_pooled: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # file name -> why
    skipped: list[str] = field(default_factory=list)      # not a dataset file (left where it is)

    @property
    def new_data(self) -> bool:
        return bool(self.accepted)

    def as_dict(self) -> dict:
        return {"accepted": self.accepted, "already_pooled": self.already_pooled, "rejected": self.rejected,
                "skipped": self.skipped}


def ensure_pool(root: Path) -> Path:
    """The pool folder exists even before any data arrives: `sft` lists it as a DVC dependency."""
    pool = Path(root) / POOL
    pool.mkdir(parents=True, exist_ok=True)
    return pool


def pool_tables(root: Path) -> list[Path]:
    """Every batch's table, in a fixed order (by batch name), so SFT's data order is reproducible."""
    return sorted((Path(root) / POOL).glob(f"*/{BATCH_TABLE}"))


def incoming_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(dataset files to admit, other entries to leave alone). Hidden files and names ending in .part or
    .tmp are still being written by whoever drops them."""
    inbox = Path(root) / INCOMING
    if not inbox.is_dir():
        return [], []
    take, leave = [], []
    for p in sorted(inbox.iterdir()):
        if p.name.startswith(".") or p.name.endswith((".part", ".tmp")):
            continue
        (take if p.is_file() and p.suffix.lower() in SUFFIXES else leave).append(p)
    return take, leave


def _move(src: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dst = folder / src.name
    if dst.exists():  # the same name dropped twice in one run: keep both
        dst = folder / f"{src.stem}.{time.time_ns()}{src.suffix}"
    shutil.move(str(src), dst)
    return dst


def admit_incoming(root: Path, run_id: str) -> Admission:
    """Validates and pools every file waiting in the inbox; never raises for a bad file."""
    from protege.data.importers import import_dataset
    from protege.errors import UserFacingError
    from protege.files import file_sha256, write_atomic

    root = Path(root)
    pool = ensure_pool(root)
    result = Admission()
    files, others = incoming_files(root)
    result.skipped = [p.name for p in others]
    for path in files:
        digest = file_sha256(path)
        batch = digest[:16]
        if (pool / batch / BATCH_TABLE).exists():
            result.already_pooled.append(batch)
            _move(path, root / ARCHIVE / run_id)
            continue
        try:
            res = import_dataset(path, SUFFIXES[path.suffix.lower()], pool / batch, "train",
                                 image_root=root / INCOMING)
        except UserFacingError as exc:  # the validation failures and the importer's own refusals
            result.rejected[path.name] = str(exc)
            moved = _move(path, root / REJECTED / run_id)
            report = {"file": path.name, "run_id": run_id, "error": str(exc), "sha256": digest}
            text = json.dumps(report, indent=2)
            write_atomic(moved.with_name(moved.name + ".report.json"), lambda tmp: tmp.write_text(text))
            continue
        meta = {"source": path.name, "sha256": digest, "run_id": run_id, "rows": res.rows_written,
                "admitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_atomic(pool / batch / "batch.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2)))
        _move(path, root / ARCHIVE / run_id)
        result.accepted.append(batch)
    return result
