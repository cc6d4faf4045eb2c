"""Several processes, and several machines, for one stage, started by torch's elastic launcher.

`processes: N` in a training section makes `protege stage NAME` run the elastic agent in its own process
(`torch.distributed.launcher.api.elastic_launch`, what torchrun runs): it starts N ranks of the same command
on this machine, each with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK, so `dvc repro`,
the Prefect flow and a Kubernetes job run a multi-process stage the same way. `auto` is one rank per visible
GPU under DeepSpeed (a job given 4 GPUs runs 4 ranks), else one.

`nodes: M` spans M machines: each runs `protege stage NAME` once (with its node rank), and the agents meet
at a c10d rendezvous at `rdzv_endpoint`, which node 0 hosts. `max_restarts: K` lets the agents restart the
whole group up to K times after a rank dies; each trainer then resumes from its last saved training state,
so a dead rank costs at most `save_every` steps.

Rank 0's output is the stage's; the other ranks write theirs to log files, whose last lines are printed
when a rank fails (with its traceback where the rank recorded one).
"""
from __future__ import annotations

import datetime
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from protege.errors import UserFacingError

# the command line's multi-node overrides, read from the environment where a scheduler sets them per pod
NODES_ENV, NODE_RANK_ENV, ENDPOINT_ENV = "PROTEGE_NODES", "PROTEGE_NODE_RANK", "PROTEGE_RDZV_ENDPOINT"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def launched() -> bool:
    """This process is one rank of a launched group (ours, torchrun's or the deepspeed launcher's)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def resolve_processes(setting: int | str, backend: str, device: str, key: str) -> int:
    """The number of ranks a stage runs on each node. `key` names the section (e.g. "rl") in errors."""
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


@dataclass(frozen=True)
class Nodes:
    """Where this machine stands in a stage that spans `count` machines."""
    count: int = 1
    rank: int = 0
    endpoint: str | None = None     # host:port of the rendezvous, hosted by node 0
    max_restarts: int = 0


def parse_endpoint(value: str, where: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserFacingError(f"{where} is {value!r}; expected HOST:PORT (e.g. node0.example:29400)")
    return host.strip("[]"), int(port)


def resolve_nodes(section, key: str, nodes: int | None = None, node_rank: int | None = None,
                  endpoint: str | None = None) -> Nodes:
    """The section's `nodes`, `rdzv_endpoint` and `max_restarts`, overridden by the command line or, where it
    says nothing, by PROTEGE_NODES / PROTEGE_NODE_RANK / PROTEGE_RDZV_ENDPOINT (a scheduler's per-pod values)."""
    def env_int(name: str) -> int | None:
        value = os.environ.get(name)
        if value in (None, ""):
            return None
        try:
            return int(value)
        except ValueError:
            raise UserFacingError(f"{name} is {value!r}; expected a whole number") from None

    from_env = env_int(NODES_ENV)
    if nodes is None and from_env is not None and section.nodes > 1 and from_env != section.nodes:
        raise UserFacingError(f"{key}.nodes is {section.nodes}, but this job runs on {from_env} node(s) "
                              f"({NODES_ENV}); give the job {section.nodes} nodes or set {key}.nodes: {from_env}")
    count = nodes if nodes is not None else from_env
    count = count if count is not None else section.nodes
    rank = node_rank if node_rank is not None else env_int(NODE_RANK_ENV)
    rank = rank if rank is not None else 0
    where = "--rdzv-endpoint"
    if endpoint is None and os.environ.get(ENDPOINT_ENV):
        endpoint, where = os.environ[ENDPOINT_ENV], ENDPOINT_ENV
    if endpoint is None and section.rdzv_endpoint:
        endpoint, where = section.rdzv_endpoint, f"{key}.rdzv_endpoint"
    if count < 1:
        raise UserFacingError(f"{key}: nodes is {count}; expected 1 or more")
    if not 0 <= rank < count:
        raise UserFacingError(f"{key}: node rank {rank} is outside 0..{count - 1} for {count} node(s)")
    if count > 1:
        if section.backend != "deepspeed":
            raise UserFacingError(f"{key}: {count} nodes train under DeepSpeed; set {key}.backend: deepspeed")
        if not endpoint:
            raise UserFacingError(f"{key}: {count} nodes need a rendezvous endpoint that every node reaches: "
                                  f"set {key}.rdzv_endpoint or pass --rdzv-endpoint HOST:PORT (node 0's address)")
    if endpoint:
        parse_endpoint(endpoint, where)
    return Nodes(count, rank, endpoint if count > 1 else None, section.max_restarts)


def launch(argv: list[str], processes: int, on_cuda: bool, threads: int = 0, nodes: Nodes = Nodes(),
           run_id: str = "protege") -> int:
    """Runs `argv` as `processes` ranks on this machine (of `nodes.count` machines) under the elastic agent and
    waits for the group; returns 0, or the failing rank's exit code once no restart is left. gloo on the CPU,
    NCCL on GPUs (each rank owns the GPU of its LOCAL_RANK)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the agent copies OMP_NUM_THREADS and inherits the rest of this process's environment into each rank
    os.environ["OMP_NUM_THREADS"] = str(max(1, (threads or os.cpu_count() or 1) // processes))
    os.environ["DS_ACCELERATOR"] = "cuda" if on_cuda else "cpu"
    os.environ["PROTEGE_EXIT_WITH_PARENT"] = "1"
    os.environ[NODES_ENV], os.environ[NODE_RANK_ENV] = str(nodes.count), str(nodes.rank)
    if nodes.count > 1:
        host, port = parse_endpoint(nodes.endpoint, "the rendezvous endpoint")
        endpoint = f"{host}:{port}"
        local_addr = "127.0.0.1" if host in LOOPBACK else None  # several "nodes" on one machine (tests)
    else:  # a store on a free port the OS picks, bound once (no race between choosing and binding it)
        endpoint, local_addr = "127.0.0.1:0", "127.0.0.1"
    logs = tempfile.mkdtemp(prefix="protege-ranks-")
    config = LaunchConfig(
        min_nodes=nodes.count, max_nodes=nodes.count, nproc_per_node=processes, run_id=run_id,
        rdzv_backend="c10d", rdzv_endpoint=endpoint, max_restarts=nodes.max_restarts, monitor_interval=0.5,
        # node 0 hosts the store whatever its host name resolves to; the others join it
        # (a node may come up minutes after another: a pod waiting for its GPU node, an image pull)
        rdzv_configs={"is_host": nodes.rank == 0, "join_timeout": 900, "read_timeout": 900},
        local_addr=local_addr,
        logs_specs=DefaultLogsSpecs(log_dir=logs, redirects={r: Std.ALL for r in range(1, processes)}))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    try:
        elastic_launch(config, argv[0])(*argv[1:])
    except ChildFailedError as exc:
        _, failure = exc.get_first_failure()
        # named as the ranks know themselves (join_node_ranks), not by the rendezvous' order of the nodes
        rank = nodes.rank * processes + failure.local_rank
        print(failure_report(rank, failure, processes * nodes.count, nodes.max_restarts, Path(logs)), file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    except SignalException as exc:  # SIGTERM / SIGINT to this process: the agent stopped every rank
        print(f"stopped by signal {exc.sigval.name}: every rank ended (what is saved is kept for a resume)",
              file=sys.stderr)
        return 128 + int(exc.sigval)
    shutil.rmtree(logs, ignore_errors=True)  # kept only where a rank failed: the report points into it
    return 0


def failure_report(rank: int, failure, world_size: int, max_restarts: int, logs: Path) -> str:
    """The failing rank, its exit (or signal), its recorded traceback or else the last lines of its output."""
    how = (f"killed by signal {failure.signal_name()}" if failure.exitcode < 0 else f"exit {failure.exitcode}")
    head = f"rank {rank} of {world_size} failed ({how})"
    if max_restarts:
        head += f" after {max_restarts} restart(s)"
    lines = [head]
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message", {})
    trace = message.get("extraInfo", {}).get("py_callstack") if isinstance(message, dict) else None
    if trace:
        lines.append(trace.rstrip())
    # the agent keeps a folder per attempt and local rank; the last attempt's is the failure's
    attempts = sorted(logs.glob(f"*/attempt_*/{failure.local_rank}"), key=lambda p: int(p.parent.name[8:]))
    for name in ("stdout.log", "stderr.log") if attempts else ():
        path = attempts[-1] / name
        if path.exists():
            tail = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][-20:]
            if tail:
                lines.append(f"--- last lines of its {name[:-4]} ({path}):")
                lines.extend(tail)
    return "\n".join(lines)


def join_node_ranks() -> None:
    """Gives this rank its place by node: RANK = node rank x ranks per node + LOCAL_RANK.

    The rendezvous numbers the nodes in the order of their host names, but the outputs must come from node 0
    (the machine the scheduler runs the stage's flow on, whose process DVC waits for). The ranks share the
    agents' store, which serves every rank alike, so any numbering that every node agrees on is valid."""
    node_rank, local_world = os.environ.get(NODE_RANK_ENV), os.environ.get("LOCAL_WORLD_SIZE")
    if (node_rank is None or local_world is None or "GROUP_RANK" not in os.environ
            or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"):
        return
    os.environ["RANK"] = str(int(node_rank) * int(local_world) + int(os.environ["LOCAL_RANK"]))


def restarts() -> int:
    """How many times the elastic agent has restarted this rank's group (0 for the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
def init_group(on_cuda: bool, timeout_s: float = 1800.0) -> None:
    """Binds this rank's GPU, then joins the launched group, before the stage runs (rank 0 prepares folders
    while the others wait at a barrier; the training runtime then finds the group made).

    Whoever launched the rank (ours, torchrun, the deepspeed launcher, an MPI launcher), the GPU is bound
    first: NCCL and object collectives (`on_rank0`'s broadcast) stage their tensors on the current CUDA
    device, so a rank that has not bound its own would put every rank on GPU 0 ("Duplicate GPU detected").
    `device_id` ties the NCCL communicator to that GPU; `timeout_s` bounds how long a collective waits for a
    rank that never comes (a dead or stuck rank fails the stage instead of hanging it).
    """
    join_node_ranks()
    # the agent stops its ranks on the signals it can catch; a SIGKILLed agent (an OOM kill) is only noticed
    # by the ranks themselves, which would otherwise hold their GPUs
    if os.environ.get("PROTEGE_EXIT_WITH_PARENT") == "1":
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
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # the agents' store outlives a restart, and with it the last attempt's addresses: a restarted rank
            # would read them and connect to a rank that is gone. Each attempt's group keys live under its own
            # prefix instead.
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size,
                                               is_master=False, timeout=kw["timeout"])
            kw.update(store=torch.distributed.PrefixStore(f"protege/attempt-{restarts()}", store), rank=rank,
                      world_size=size)
        torch.distributed.init_process_group("nccl" if on_cuda else "gloo", **kw)
