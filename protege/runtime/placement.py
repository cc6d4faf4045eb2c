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
    device = torch.device("cuda", local_rank())
    torch.cuda.set_device(device)
    return device


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
