"""One writer per project folder: DVC's workspace, params.yaml and the pool are shared by every flow that
runs there (pipeline, retrain, study), so each holds this lock for its whole run.

An OS file lock (flock) is released by the kernel when its holder dies, so a killed run never leaves a
stale lock behind; the file's text names the holder for the error a second writer sees.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from protege.errors import UserFacingError

LOCK_FILE = ".protege.lock"


class WorkspaceBusy(UserFacingError):
    pass


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    return f"{info.get('what', 'a run')} (pid {info.get('pid', '?')}, since {info.get('since', '?')})"


@contextmanager
def workspace_lock(project_dir: str | Path, what: str, wait_s: float = 0.0, poll_s: float = 2.0,
                   on_wait=None) -> Iterator[None]:
    """Holds the project's lock for the block. Waits up to `wait_s` seconds (0: refuse at once) and then
    raises WorkspaceBusy naming the holder; `on_wait(holder)` is called once when it has to wait."""
    path = Path(project_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + max(0.0, wait_s)
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise WorkspaceBusy(f"{Path(project_dir).resolve()}: {_holder(path)} is writing to this "
                                        f"project; {what} refused (one writer per DVC workspace)") from None
                if on_wait and not told:
                    on_wait(_holder(path))
                    told = True
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"what": what, "pid": os.getpid(),
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
