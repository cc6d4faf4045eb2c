"""Which process this is and what the processes of one data-parallel run share.

torchrun and the deepspeed launcher describe the run in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT); a plain `python` / `protege` process is rank 0 of 1 and needs no process group.
"""
from __future__ import annotations

import os

import torch

from protege.errors import UserFacingError


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when not launched distributed."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def one_process(what: str) -> None:
    """Refuses a multi-process launch for a loop that trains in one process (each rank would repeat it)."""
    if world()[1] > 1:
        raise UserFacingError(f"{what} train in one process; this one was launched as rank {world()[0]} of "
                              f"{world()[1]} (torchrun / deepspeed): launch it without them")


# where launchers other than torchrun and the deepspeed launcher put a rank's index on its machine
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                   "SLURM_LOCALID")


def local_rank() -> int:
    """Which accelerator of this machine the process owns: LOCAL_RANK (torchrun, the deepspeed launcher, ours),
    or an MPI launcher's local rank; 0 for a process no launcher started."""
    for var in LOCAL_RANK_VARS:
        value = os.environ.get(var)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise UserFacingError(f"{var} is {value!r}: expected this process's index on its machine") from None
    if world()[1] > 1:
        raise UserFacingError(f"this process is rank {world()[0]} of {world()[1]} (RANK, WORLD_SIZE) but no launcher "
                              f"said its index on this machine ({', '.join(LOCAL_RANK_VARS)}): set LOCAL_RANK")
    return 0


def _grouped() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and world()[1] > 1


def barrier() -> None:
    if _grouped():
        torch.distributed.barrier()


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """The sum of `value` over all processes (a copy; `value` itself is left alone)."""
    return _all_reduce(value, "SUM")


def all_reduce_max(value: torch.Tensor) -> torch.Tensor:
    """The elementwise largest `value` over all processes (a copy)."""
    return _all_reduce(value, "MAX")


def _all_reduce(value: torch.Tensor, op: str) -> torch.Tensor:
    out = value.detach().clone()
    if _grouped():
        # NCCL reduces device tensors only: a count kept on the CPU goes to this rank's bound GPU and back
        staged = (out.to(torch.device("cuda", torch.cuda.current_device()))
                  if out.device.type == "cpu" and torch.distributed.get_backend() == "nccl" else out)
        torch.distributed.all_reduce(staged, op=getattr(torch.distributed.ReduceOp, op))
        out = staged.to(value.device)
    return out


def rows_per_rank(local_rows: int) -> float:
    """The global batch's rows (summed over ranks, collective) divided by the number of ranks: the denominator
    that makes a rank's summed loss its share of the global mean when the updater averages the ranks'
    gradients, however unevenly the rows split. One process: `local_rows`."""
    return per_rank(local_rows)


def per_rank(local_count: float) -> float:
    """rows_per_rank for any count a loss is averaged over (turns, tokens): the sum over the ranks of
    `local_count` (collective) divided by the number of ranks. One process: `local_count`."""
    if not _grouped():
        return float(local_count)
    return float(all_reduce_sum(torch.tensor(float(local_count), dtype=torch.float64))) / world()[1]


def sum_over_ranks(values: list[float]) -> list[float]:
    """Each figure summed over the ranks (collective, in float64). One process: the figures as they are."""
    if not _grouped():
        return [float(v) for v in values]
    return all_reduce_sum(torch.tensor(values, dtype=torch.float64)).tolist()


def mean_std_over_ranks(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and the (unbiased) standard deviation of every rank's `values` together (1-D; collective, two
    all-reduces: the count and sum, then the squared deviations from the global mean). One process:
    `values.mean()` and `values.std()` themselves."""
    if not _grouped():
        return values.mean(), values.std()
    x = values.detach().double()
    n, total = all_reduce_sum(torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64), x.sum()]))
    mean = total / n
    square = all_reduce_sum(((x - mean) ** 2).sum())
    return mean.to(values.dtype), (square / (n - 1)).sqrt().to(values.dtype)


def gather_objects(value) -> list:
    """Every rank's `value` (picklable), in rank order (collective). One process: [value]."""
    if not _grouped():
        return [value]
    every = [None] * world()[1]
    torch.distributed.all_gather_object(every, value)
    return every


def global_mean_share(local_mean: torch.Tensor, local_count: int, global_count: int, world_size: int) -> torch.Tensor:
    """This rank's part of a mean over the whole global batch, for updaters that average gradients.

    With `local_mean` = (sum of this rank's item losses) / local_count, the share is
    sum_local / global_count * world_size: DeepSpeed divides the summed gradients by world_size, which leaves
    exactly the gradient of sum_all / global_count, the mean over every item of the global batch (a mean of
    per-rank means would weight an item on a rank with few items more). Written as a factor on the local mean
    so that one process (factor exactly 1.0) gives bitwise the plain mean.
    """
    if global_count <= 0 or local_count <= 0:
        raise ValueError(f"a loss share needs items on this rank and in the batch (local {local_count}, "
                         f"global {global_count})")
    return local_mean * (local_count * world_size / global_count)


def on_rank0(fn):
    """Runs `fn()` on rank 0 alone (folder preparation, a file other ranks then read) and hands its result to
    every rank; the others wait for it. One process: just `fn()`."""
    if not _grouped():
        return fn()
    box = [fn() if world()[0] == 0 else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def weights_checksum(model: torch.nn.Module) -> list[float]:
    """Two float64 sums per parameter (of the values and of their squares): equal weights give equal lists."""
    with torch.no_grad():
        return [float(v) for p in model.parameters() for v in (p.double().sum(), p.double().pow(2).sum())]


def check_ranks_agree(model: torch.nn.Module, what: str) -> None:
    """Every rank holds the same weights after a data-parallel run (collective; whole weights needed, so under
    ZeRO-3 call it inside the updater's `gathered()`). A rank that drifted is a bug: the run stops, named."""
    if not _grouped():
        return
    mine = weights_checksum(model)
    every = [None] * world()[1]
    torch.distributed.all_gather_object(every, mine)
    drifted = [r for r, c in enumerate(every) if c != every[0]]
    if drifted:
        raise RuntimeError(f"{what}: ranks {drifted} end with weights other than rank 0's")


def mean_over_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """Each figure averaged over the ranks that report it (collective): a step's metrics of every rank's share
    of the batch, logged by rank 0. One process: the figures as they are."""
    if not _grouped():
        return metrics
    every = [None] * world()[1]
    torch.distributed.all_gather_object(every, metrics)
    keys = dict.fromkeys(k for m in every for k in m)
    return {k: sum(m[k] for m in every if k in m) / sum(k in m for m in every) for k in keys}
