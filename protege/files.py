"""Writing files so that a kill never leaves a half-written one: a temp file beside it, fsynced, renamed."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temp file beside `path`, which then replaces `path` in one rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """A hash of a file's bytes, read in 1 MiB blocks (images, shards and weights can be large)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return file_digest(path, "sha256")


def file_md5(path: Path) -> str:
    """md5 of a file's bytes: what DVC 3 records for a file."""
    return file_digest(path, "md5")
