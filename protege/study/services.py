"""Local services a study starts for its runs: today the loopback LLM judge.

A service declared in the study file (`services: {judge: {kind: loopback_judge, port: 18765}}`) is
started when a pending run's config points at it (rl.judge_model or evaluate.judge with a base_url on
127.0.0.1 / localhost at its port), once for the whole study, and stopped when the study ends; runs in
parallel share it.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from urllib.parse import urlparse

from protege.config import Config
from protege.errors import UserFacingError
from protege.paths import CURATED_RL, split_table
from protege.study.spec import ServiceSpec, Study

LOCAL_HOSTS = {"127.0.0.1", "localhost"}
_started: dict[int, subprocess.Popen] = {}  # pid -> the server process this process started


def ports_used(cfg: Config) -> set[int]:
    """Loopback ports the config's judges talk to."""
    ports = set()
    for spec in (cfg.rl.judge_model if cfg.rl.judge == "llm" else None, cfg.evaluate.judge):
        if spec is not None and spec.base_url:
            url = urlparse(spec.base_url)
            if url.hostname in LOCAL_HOSTS and url.port:
                ports.add(url.port)
    return ports


def needed(study: Study, configs: list[Config]) -> dict[str, ServiceSpec]:
    used = set().union(*(ports_used(c) for c in configs)) if configs else set()
    return {name: s for name, s in study.services.items() if s.port in used}


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(study: Study, configs: list[Config], log=print, timeout_s: float = 60.0) -> list[int]:
    """Starts the services the configs need; returns their process ids (for `stop`)."""
    pids = []
    for name, spec in needed(study, configs).items():
        if _port_open(spec.port):
            raise UserFacingError(f"{study.path}: services.{name}: port {spec.port} is already in use; stop what "
                                  "listens there or pick another port (and the base_url that names it)")
        pools = {split_table(c.data.source, "rl") for c in configs}
        tables = [str(study.project / t) for t in (CURATED_RL, *sorted(pools)) if (study.project / t).exists()]
        cmd = [sys.executable, "-m", "protege.loopback_server", "--port", str(spec.port), "--judge",
               "--latency", str(spec.latency_s), "--judge-rows", *tables]
        log_path = study.out_dir / "services" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _started[proc.pid] = proc
        pids.append(proc.pid)
        deadline = time.monotonic() + timeout_s
        while not _port_open(spec.port):
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(pids)
                raise UserFacingError(f"services.{name}: the loopback judge did not start on port {spec.port}; "
                                      f"see {log_path}")
            time.sleep(0.1)
        log(f"service {name}: loopback judge on http://127.0.0.1:{spec.port}/v1 (pid {proc.pid})")
    return pids


def stop(pids: list[int]) -> None:
    for pid in pids:
        proc = _started.pop(pid, None)
        if proc is None or proc.poll() is not None:
            continue
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def running(study: Study, configs: list[Config], log=print):
    pids = start(study, configs, log)
    try:
        yield pids
    finally:
        stop(pids)
