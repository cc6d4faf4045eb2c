"""Local service mode (`make serve` / `make stop`): a Prefect server, one process worker and an MLflow
tracking server on loopback, with every deployment of prefect.yaml applied to the single local pool.

    python -m flows.service start [--detach]   # prints the two UI addresses; Ctrl-C stops everything
    python -m flows.service stop               # stops exactly what `start` started (from .service/service.json)

Each service runs in its own process group, so stopping one also stops what it spawned (the worker's flow
runs, the servers' own workers) and nothing else. Logs go to .service/*.log. Beside them runs a stage host
(protege/stage_host.py): each stage a retrain dispatches is a flow run of its own, and its `protege stage`
command is forked from the host instead of importing torch, transformers and MLflow again (about 5 s a stage).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from protege.stage_client import SOCKET_ENV

STATE_DIR = ".service"
STATE_FILE = "service.json"
LOCAL_POOL = "local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def service_env(project: Path, prefect_port: int, mlflow_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update({
        "PREFECT_HOME": str(project / STATE_DIR / "prefect"),
        "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
        "PREFECT_SERVER_EPHEMERAL_ENABLED": "false",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_API_URL": f"http://127.0.0.1:{prefect_port}/api",
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}",
        # prefect.yaml names its work pools and folder through these: one local process pool for everything
        "PROTEGE_CPU_POOL": LOCAL_POOL,
        "PROTEGE_GPU_POOL": LOCAL_POOL,
        "PROTEGE_PROJECT_DIR": str(project),
        "PYTHONUNBUFFERED": "1",
    })
    # the local worker asks its (local) server for runs every 2 s, not 10: each stage of a retrain is a flow run
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", "2")
    # a retrain triggered while another runs waits for the one-writer slot; the server re-offers it every 5 s,
    # not Prefect's 30, so it starts within seconds of the other's end (a local server: no load to spare)
    env.setdefault("PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS", "5")
    return env


def wait_http(url: str, proc: subprocess.Popen, what: str, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it answered; see {log}:\n"
                               + log.read_text()[-2000:])
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s; see {log}")


def _spawn(cmd: list[str], env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _prefect(args: list[str], env: dict, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"prefect {' '.join(args)} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")


def start(project: Path, prefect_port: int, mlflow_port: int) -> dict:
    project = project.resolve()
    state_dir = project / STATE_DIR
    state_dir.mkdir(exist_ok=True)
    state_path = state_dir / STATE_FILE
    if state_path.exists():
        old = json.loads(state_path.read_text())
        if any(_alive(p) for p in old.get("pids", {}).values()):
            raise SystemExit(f"a service is already running here (pids {old['pids']}); `make stop` first")
    for port in (prefect_port, mlflow_port):
        if not port_free(port):
            raise SystemExit(f"port {port} on 127.0.0.1 is taken; set PREFECT_PORT / MLFLOW_PORT")
    env = service_env(project, prefect_port, mlflow_port)
    state = {"project": str(project), "supervisor": os.getpid(), "pids": {},
             "prefect_ui": f"http://127.0.0.1:{prefect_port}", "mlflow_ui": f"http://127.0.0.1:{mlflow_port}",
             "prefect_api": env["PREFECT_API_URL"], "mlflow_tracking_uri": env["MLFLOW_TRACKING_URI"]}

    def save() -> None:
        state_path.write_text(json.dumps(state, indent=2))

    try:
        logs = {name: state_dir / f"{name}.log" for name in ("prefect-server", "mlflow-server", "worker",
                                                             "stage-host")}
        # a short path: a unix socket's path is limited to ~100 bytes, a project's folder is not
        state["stage_host_socket"] = str(Path(tempfile.mkdtemp(prefix="protege-host-")) / "sock")
        host = _spawn([sys.executable, "-u", "-m", "protege.stage_host", state["stage_host_socket"]], env, project,
                      logs["stage-host"])
        state["pids"]["stage-host"] = host.pid
        env = dict(env, **{SOCKET_ENV: state["stage_host_socket"]})  # the worker's flow runs inherit it
        server = _spawn([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                         "--port", str(prefect_port)], env, project, logs["prefect-server"])
        state["pids"]["prefect-server"] = server.pid
        (project / "mlartifacts").mkdir(exist_ok=True)
        mlflow = _spawn([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
                         "--backend-store-uri", f"sqlite:///{project / 'mlflow.db'}",
                         "--artifacts-destination", str(project / "mlartifacts"), "--workers", "1"],
                        env, project, logs["mlflow-server"])
        state["pids"]["mlflow-server"] = mlflow.pid
        save()
        wait_http(f"http://127.0.0.1:{prefect_port}/api/health", server, "the Prefect server", logs["prefect-server"])
        wait_http(f"http://127.0.0.1:{mlflow_port}/health", mlflow, "the MLflow server", logs["mlflow-server"])
        _prefect(["work-pool", "create", LOCAL_POOL, "--type", "process", "--overwrite"], env, project)
        _prefect(["--no-prompt", "deploy", "--all"], env, project)
        worker = _spawn([sys.executable, "-m", "prefect", "worker", "start", "--pool", LOCAL_POOL,
                         "--name", "local-worker"], env, project, logs["worker"])
        state["pids"]["worker"] = worker.pid
        save()
    except BaseException:
        stop(project)
        raise
    return state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. A member that has exited but that nobody has reaped yet
    (a zombie: the detached services' parent is gone, and some init processes reap late or never) does not
    count, though signal 0 still reaches it."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def stop(project: Path, grace_s: float = 20.0) -> list[str]:
    """Ends every process group `start` recorded: SIGTERM, then SIGKILL after `grace_s`."""
    state_path = project.resolve() / STATE_DIR / STATE_FILE
    if not state_path.exists():
        return []
    state = json.loads(state_path.read_text())
    groups = dict(state.get("pids", {}))
    for pgid in groups.values():  # each service leads its own group (start_new_session)
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups.values()):
        time.sleep(0.5)
    for pgid in groups.values():
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    supervisor = state.get("supervisor")
    if supervisor and supervisor != os.getpid() and _alive(supervisor):
        os.kill(supervisor, signal.SIGTERM)  # a foreground `make serve` ends too
    if state.get("stage_host_socket"):
        socket_path = Path(state["stage_host_socket"])
        socket_path.unlink(missing_ok=True)
        try:
            socket_path.parent.rmdir()
        except OSError:
            pass
    state_path.unlink(missing_ok=True)
    return sorted(groups)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("--project", default=".")
    ap.add_argument("--prefect-port", type=int, default=int(os.environ.get("PREFECT_PORT", 4200)))
    ap.add_argument("--mlflow-port", type=int, default=int(os.environ.get("MLFLOW_PORT", 5000)))
    ap.add_argument("--detach", action="store_true", help="return once everything is up (stop with `stop`)")
    args = ap.parse_args(argv)
    project = Path(args.project).resolve()
    if args.action == "stop":
        stopped = stop(project)
        print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
        return 0
    state = start(project, args.prefect_port, args.mlflow_port)
    if args.detach:  # nothing stays behind to supervise; a later pid with this number is not ours
        state["supervisor"] = None
        (project / STATE_DIR / STATE_FILE).write_text(json.dumps(state, indent=2))
    print(f"Prefect UI: {state['prefect_ui']}\nMLflow UI:  {state['mlflow_ui']}\n"
          f"worker on pool '{LOCAL_POOL}'; deployments: pipeline, retrain (nightly), evaluate, study, stage-cpu, "
          f"stage-gpu\nlogs: {project / STATE_DIR}/*.log", flush=True)
    if args.detach:
        return 0
    print("Ctrl-C (or `make stop`) ends all of it", flush=True)
    stopping = {"now": False}

    def on_signal(signum, frame):
        stopping["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stopping["now"]:
        time.sleep(1)
    stop(project)
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
