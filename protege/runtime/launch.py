"""Several processes started by the stage itself: `processes: N` in a training stage's section makes
`protege stage NAME` start N ranks of the same command (as torch's launcher would: RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so `dvc repro`, the Prefect flow and a Kubernetes job run a
multi-process stage the same way. `auto` is one rank per visible GPU under DeepSpeed (a job given 4 GPUs runs
4 ranks), else one.

Rank 0's output is the stage's; the other ranks write theirs to a log file, printed when that rank fails. A
rank that fails stops the others (they would wait in a collective forever) and the stage fails with its
last line.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from protege.errors import UserFacingError

RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched() -> bool:
    """This process is one rank of a launched group (ours, torchrun's or the deepspeed launcher's)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_processes(setting: int | str, backend: str, device: str, key: str) -> int:
    """The number of ranks a stage runs on. `key` names the section (e.g. "rl") in errors."""
    if setting == "auto":
        gpus = torch.cuda.device_count() if device != "cpu" and torch.cuda.is_available() else 0
        return gpus if backend == "deepspeed" and gpus > 1 else 1
    if setting > 1 and backend != "deepspeed":
        raise UserFacingError(f"{key}.processes is {setting}, but {key}.backend 'torch' trains in one process; "
                              f"set {key}.backend: deepspeed")
    if setting > 1 and device != "cpu" and torch.cuda.is_available() and setting > torch.cuda.device_count():
        raise UserFacingError(f"{key}.processes is {setting}, but this machine shows {torch.cuda.device_count()} "
                              f"GPU(s); one rank per GPU (or set {key}.device: cpu)")
    return int(setting)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def launch(argv: list[str], processes: int, on_cuda: bool, threads: int = 0) -> int:
    """Runs `argv` as `processes` ranks on this machine and waits for all; returns the exit code (0, or the
    first failing rank's). gloo on the CPU, NCCL on GPUs (each rank owns the GPU of its LOCAL_RANK)."""
    port = str(_free_port())
    logs = Path(tempfile.mkdtemp(prefix="protege-ranks-"))
    procs = []
    per_rank_threads = str(max(1, (threads or os.cpu_count() or 1) // processes))
    for rank in range(processes):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(processes),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS=per_rank_threads,
                   DS_ACCELERATOR="cuda" if on_cuda else "cpu", PROTEGE_EXIT_WITH_PARENT="1")
        out = None if rank == 0 else open(logs / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if out else None))
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0):
                failed = rank
                break
        time.sleep(0.2)
    if failed is None:
        failed = next((r for r, p in enumerate(procs) if p.returncode), None)
    if failed is not None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if failed > 0:
            log = logs / f"rank{failed}.log"
            print(f"rank {failed} of {processes} failed (exit {procs[failed].returncode}): {_last_line(log)} "
                  f"(whole log: {log})", file=sys.stderr)
        return procs[failed].returncode or 1
    return 0


def init_group(on_cuda: bool, timeout_s: float = 1800.0) -> None:
    """Binds this rank's GPU, then joins the launched group, before the stage runs (rank 0 prepares folders
    while the others wait at a barrier; the training runtime then finds the group made).

    Whoever launched the rank (ours, torchrun, the deepspeed launcher, an MPI launcher), the GPU is bound
    first: NCCL and object collectives (`on_rank0`'s broadcast) stage their tensors on the current CUDA
    device, so a rank that has not bound its own would put every rank on GPU 0 ("Duplicate GPU detected").
    `device_id` ties the NCCL communicator to that GPU; `timeout_s` bounds how long a collective waits for a
    rank that never comes (a dead or stuck rank fails the stage instead of hanging it).
    """
    if os.environ.get("PROTEGE_EXIT_WITH_PARENT") == "1":  # our launcher's rank: it ends when the launcher is gone
        from protege.runtime.parent_watch import exit_with_parent

        exit_with_parent()
    device = None
    if on_cuda:
        from protege.runtime.placement import bind_gpu

        device = bind_gpu()
    if launched() and int(os.environ["WORLD_SIZE"]) > 1 and not torch.distributed.is_initialized():
        kw = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if device is not None:
            kw["device_id"] = device
        torch.distributed.init_process_group("nccl" if on_cuda else "gloo", **kw)
