"""Handing the host memory a step freed back to the system before a save allocates its copies.

glibc keeps freed heap chunks (a step's activations and temporaries on the CPU, its host-side buffers on a GPU)
for reuse instead of returning them, so the process's resident memory after an update stays near the update's
peak, and a checkpoint's merged weights allocated next come on top of it. Measured on one RIL step of a
7B-width student (2 layers, bf16, LoRA, 4 questions): the checkpoint save peaked at 9.81 GiB of resident memory
without a trim and 8.60 GiB with one, against 9.10 GiB planned for weights, optimizer, discriminator and the
merged copy.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to hand back this way
        return None


def release_free_host_memory() -> bool:
    """Returns freed heap memory to the system; False where the C library cannot."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
