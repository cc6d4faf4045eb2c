"""dvc.lock while stages run beside each other.

DVC rewrites dvc.lock in place, not by rename, on every commit. With `orchestration.jobs` > 1 the flow commits
one stage while another stage's process may be reading the lock (input digests, the stage record), and a
reader could see half a file. So the flow's DVC calls hold an exclusive lock on GUARD and readers hold it
shared; a project without a .dvc folder has no concurrent commits and is read as is."""
from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

import yaml

GUARD = Path(".dvc") / "tmp" / "protege-dvc-lock"


@contextlib.contextmanager
def _flock(project_dir: Path, mode: int) -> Iterator[None]:
    guard = Path(project_dir) / GUARD
    if not guard.parent.parent.is_dir():
        yield
        return
    guard.parent.mkdir(exist_ok=True)
    with open(guard, "a") as f:
        fcntl.flock(f.fileno(), mode)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def dvc_writing(project_dir: str | Path) -> Iterator[None]:
    """Held around a DVC command that rewrites dvc.lock (commit, add) and runs no stage: a stage inside would
    wait on itself reading the lock. Threads of one process exclude each other too (one open file each)."""
    with _flock(Path(project_dir), fcntl.LOCK_EX):
        yield


def read_dvc_lock(project_dir: str | Path) -> str | None:
    """The text of PROJECT/dvc.lock as no commit is half-way through writing it; None when there is none."""
    path = Path(project_dir) / "dvc.lock"
    with _flock(Path(project_dir), fcntl.LOCK_SH):
        return path.read_text() if path.is_file() else None


def parse_dvc_file(text: str):
    """dvc.yaml or dvc.lock text as Python objects, with libyaml's parser when PyYAML has it: every stage reads
    dvc.lock (100+ kB for the demo) a few times, 0.27 s each with the pure-Python parser against 0.04 s.
    Both parsers feed the same safe constructor."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def read_dvc_yaml(project_dir: str | Path) -> dict:
    """The stages of PROJECT/dvc.yaml as written (DVC's `${...}` templates are not filled in)."""
    return (parse_dvc_file((Path(project_dir) / "dvc.yaml").read_text()) or {}).get("stages", {})
