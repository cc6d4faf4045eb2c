"""The client side of the stage host (`protege.stage_host`): what `protege stage` calls to have a warm host
run it. It knows the host only by the socket named in PROTEGE_STAGE_HOST, so the CLI needs nothing of the
host, and the host (which runs the CLI) nothing of this but the variable's name."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket

SOCKET_ENV = "PROTEGE_STAGE_HOST"


def run_via_host(argv: list[str]) -> int | None:
    """Runs `protege ARGV` in the host named by PROTEGE_STAGE_HOST; None when there is none to reach
    (the caller then runs the command itself)."""
    path = os.environ.get(SOCKET_ENV)
    if not path or not os.path.exists(path):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        req = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
        socket.send_fds(conn, [json.dumps(req).encode()], [0, 1, 2])
    except OSError:
        conn.close()
        return None
    reader = conn.makefile("r")
    first = reader.readline()
    if not first:
        return None  # the host went away before it forked: run here
    pid = json.loads(first)["pid"]

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    line = reader.readline()
    return json.loads(line)["exit"] if line else 1
