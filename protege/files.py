"""Writing files so that a kill never leaves a half-written one: a temp file beside it, fsynced, renamed."""
from __future__ import annotations

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
