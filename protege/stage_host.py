"""A warm process for the `protege stage` commands of one pipeline run.

Each stage is its own process (DVC runs `protege stage NAME`), and each used to pay for importing
python, torch, transformers and MLflow again: about 8 s of 2 cores per stage, 13 times per run. The host
imports all that once and forks a child per stage. `protege stage` (the command DVC runs) finds the host
through PROTEGE_STAGE_HOST (`stage_client`), hands it its argv, folder, environment and its stdin/stdout/stderr
descriptors, and waits for the child's exit status; the child writes straight to DVC's pipes. Without a
host, or if it cannot be reached, the command runs in its own process as before, so results never depend
on it. Signals the command gets are passed on to the child; if the command dies the child is stopped.

The host stays single-threaded (fork copies only the calling thread) and never runs torch code itself, so
a child starts from a clean torch. Each request is handled in a process of its own: stages of independent
branches (the pipeline's `orchestration.jobs`) run at the same time.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from protege.stage_client import SOCKET_ENV

MAX_MESSAGE = 1 << 20


def _preload() -> None:
    import great_expectations  # noqa: F401  (validate and data import: ~1.6 s of a core each time)
    import mlflow  # noqa: F401
    import mlflow.store.model_registry.sqlalchemy_store  # noqa: F401  (every stage's tracking: sqlalchemy,
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401         alembic; ~0.5 s a stage)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from protege import cli, tracking  # noqa: F401
    from protege.stages import STAGES

    for name in STAGES:
        importlib.import_module(f"protege.stages.{name}")


def _child(conn: socket.socket, listener: socket.socket, fds: list[int], req: dict) -> None:
    """In the forked child: become the `protege stage` process that asked, run it, exit with its code."""
    code = 1
    try:
        listener.close()
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["protege", *req["argv"]]
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from protege.cli import app

        try:
            app(args=req["argv"], prog_name="protege")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _send(conn: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(msg).encode() + b"\n")


def _handle(conn: socket.socket, listener: socket.socket) -> None:
    data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return
    req = json.loads(data)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(conn, listener, fds, req)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, conn], [], [])
            if pidfd in ready:
                _, status = os.waitpid(pid, 0)
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                return
            if conn in ready and not conn.recv(4096):  # the command is gone: so goes its stage
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
                return
    finally:
        os.close(pidfd)


def serve(path: str) -> None:
    _preload()
    if threading.active_count() != 1:  # forking a multi-threaded process is unsafe: run without a host
        print(f"stage host: {threading.active_count()} threads after imports; not serving", file=sys.stderr)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.tmp"
    listener.bind(tmp)
    listener.listen(8)
    os.replace(tmp, path)  # clients see the socket only once it accepts
    # each request gets a handler process of its own, so stages of independent branches run at once; the
    # host reaps nothing itself (SIGCHLD ignored), a handler waits for its stage as before
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        conn, _ = listener.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _handle(conn, listener)
            except Exception:  # one bad request must not end the host
                traceback.print_exc()
            finally:
                os._exit(0)
        conn.close()


@contextlib.contextmanager
def running():
    """A host for the block: PROTEGE_STAGE_HOST is set in this process's environment (so DVC's commands
    inherit it) and the host is stopped afterwards."""
    folder = tempfile.mkdtemp(prefix="protege-host-")
    path = str(Path(folder) / "sock")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "protege.stage_host", path], stdin=subprocess.DEVNULL)
    old = os.environ.get(SOCKET_ENV)
    os.environ[SOCKET_ENV] = path
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop(SOCKET_ENV, None)
        else:
            os.environ[SOCKET_ENV] = old
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(path)
            os.rmdir(folder)


if __name__ == "__main__":
    serve(sys.argv[1])
