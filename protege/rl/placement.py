"""Where the RL models live: only the model being updated needs to sit on the accelerator.

The RIL paper offloads the model that is not being updated. Here the policy stays on the device; with
`rl.offload_idle` the reference model comes to the device only for its log-prob pass and the
discriminator only for its updates and scoring, so device memory holds one extra model at a time.
On the CPU every move is a no-op, so results do not depend on the switch.
"""
from __future__ import annotations

import contextlib

import torch

from protege.errors import UserFacingError

CPU = torch.device("cpu")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else CPU
    if name == "cuda" and not torch.cuda.is_available():
        raise UserFacingError("rl.device is 'cuda' but this torch build sees no CUDA device "
                              f"(torch {torch.__version__}); use rl.device: cpu or auto")
    return torch.device(name)


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
