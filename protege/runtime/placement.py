"""Where a stage trains, and keeping only the model being updated on the accelerator.

The RIL paper offloads the model that is not being updated: with `rl.offload_idle` the reference model
comes to the device only for its log-prob pass and the discriminator only for its updates and scoring, so
device memory holds one extra model at a time. On the CPU every move is a no-op, so results do not depend
on the switch.
"""
from __future__ import annotations

import contextlib

import torch

from protege.errors import UserFacingError
from protege.runtime.distributed import local_rank

CPU = torch.device("cpu")


def rank_gpu() -> torch.device:
    """The GPU this process owns: that of its local rank (one rank per GPU). A launcher that shows each rank
    a single GPU (CUDA_VISIBLE_DEVICES set per process) leaves it index 0."""
    index, visible = local_rank(), torch.cuda.device_count()
    if visible == 1:
        return torch.device("cuda", 0)
    if index >= visible:
        raise UserFacingError(f"this process has local rank {index} but sees {visible} GPU(s): start one rank per "
                              "GPU (or fewer processes on this machine)")
    return torch.device("cuda", index)


def bind_gpu() -> torch.device:
    """Makes this rank's GPU the current CUDA device (what NCCL and object collectives stage on) and returns it."""
    device = rank_gpu()
    torch.cuda.set_device(device)
    return device


def resolve_device(name: str, key: str) -> torch.device:
    """`auto | cpu | cuda` -> a device; `key` (e.g. "sft.device") names the setting in errors.

    Under torchrun / deepspeed each process owns the GPU of its LOCAL_RANK: "cuda" alone would put every
    rank on GPU 0.
    """
    if name not in ("auto", "cpu", "cuda"):
        raise UserFacingError(f"{key} is {name!r}; expected 'auto', 'cpu' or 'cuda'")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return CPU
    if not torch.cuda.is_available():
        raise UserFacingError(f"{key} is 'cuda' but this torch build sees no CUDA device "
                              f"(torch {torch.__version__}); use {key}: cpu or auto")
    return bind_gpu()


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


@contextlib.contextmanager
def visiting(target, device: torch.device, offload: bool):
    """`target` (a module, or an updater that also carries its optimizer state) on `device` for the block."""
    if not offload:
        yield
        return
    target.to(device)
    try:
        yield
    finally:
        target.to(CPU)
