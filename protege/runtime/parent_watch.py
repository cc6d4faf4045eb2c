"""A child process that ends when the process that started it is gone.

A study's run and a stage's ranks are started by a parent that waits on them. When that parent is killed (a
scheduler cancelling the flow, SIGTERM, an out-of-memory kill) nothing else stops them: a study run would go on
writing the folder that the study, started again, hands to a fresh process for the same run, and a rank would
hold its GPU. Their state on disk is what a kill leaves, so the restarted parent resumes from it.
"""
from __future__ import annotations

import os
import sys
import threading
import time


def exit_with_parent(poll_s: float = 2.0, code: int = 143) -> threading.Thread:
    """Starts a daemon thread that ends this process (exit `code`, as a SIGTERM would) once its parent changes,
    i.e. the parent died and this process was handed to another. Checks every `poll_s` seconds."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                print(f"parent process {parent} is gone: stopping (what is saved is kept for a resume)",
                      file=sys.stderr, flush=True)
                os._exit(code)

    thread = threading.Thread(target=watch, name="exit-with-parent", daemon=True)
    thread.start()
    return thread
