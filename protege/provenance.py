"""What made a checkpoint or a training state: `protege.json` beside its files.

The `protege stage` command records, before the stage runs, the resolved params the stage reads (its keys in
dvc.yaml), the code version (protege's version, the git commit and whether tracked files differ from it) and
the digests of its data inputs; every checkpoint folder and training state written during the stage gets
that record, so a folder copied out of the project still says how it was made. Outside a stage (a library
call, a test) nothing is written.
"""
from __future__ import annotations

import json
from pathlib import Path

FILE = "protege.json"
_current: dict | None = None


def set_current(record: dict | None) -> None:
    global _current
    _current = record


def current() -> dict | None:
    return _current


def write(folder: str | Path, record: dict | None = None) -> None:
    """`record` (default: the running stage's) as folder/protege.json; nothing when there is none."""
    record = record if record is not None else _current
    if record is None:
        return
    Path(folder, FILE).write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")


def read(folder: str | Path) -> dict | None:
    path = Path(folder, FILE)
    return json.loads(path.read_text()) if path.exists() else None
