"""Device-wide GPU memory sampled from a background thread: the peak a part of the GPU check really reached.

torch.cuda.max_memory_allocated sees only torch's caching allocator of this process, and vLLM resets it (its
memory profiling calls reset_peak_memory_stats), so a part that starts an engine would report a peak that
leaves the engine's weights, KV cache and CUDA graphs out. This samples the memory in use on the whole
device every `interval_s` instead:

  nvml          nvidia-ml-py (pynvml): nvmlDeviceGetMemoryInfo(handle).used, the driver's own count (every
                process on the device and each one's CUDA context included)
  mem_get_info  torch.cuda.mem_get_info: total - free, the same device-wide figure from the CUDA runtime
  none          no CUDA device (the CPU smoke paths): every figure is None

    with DeviceMemorySampler() as mem:
        ...work...
    mem.peak_gib, mem.baseline_gib, mem.source

The baseline is the first reading (what the device held before the part started: other processes, a CUDA
context already made); `peak_gib - baseline_gib` is what the part added. A sample is a point in time: a
spike shorter than the interval can fall between two samples.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

GiB = 1 << 30


def nvml_reader(index: int = 0) -> Callable[[], int] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:  # noqa: BLE001 - NVML missing or refused (a container without the library): no reader
        return None
    return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def cuda_reader(index: int = 0) -> Callable[[], int] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None

    def read() -> int:
        free, total = torch.cuda.mem_get_info(index)
        return int(total - free)

    return read


def physical_index(index: int = 0) -> int:
    """NVML numbers devices as the driver does, ignoring CUDA_VISIBLE_DEVICES: the physical index of visible
    device `index` (the visible list's entry when it is a plain number)."""
    import os

    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


def default_reader(index: int = 0) -> tuple[Callable[[], int] | None, str]:
    """(reader, source): NVML where it answers, else the CUDA runtime, else nothing (no CUDA device)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None, "none"
    except ImportError:
        return None, "none"
    reader = nvml_reader(physical_index(index))
    if reader is not None:
        return reader, "nvml"
    reader = cuda_reader(index)
    return (reader, "mem_get_info") if reader is not None else (None, "none")


class DeviceMemorySampler:
    """Samples device-wide used memory in a daemon thread between __enter__ and __exit__ (or start / stop)."""

    def __init__(self, reader: Callable[[], int] | None = None, interval_s: float = 0.05, index: int = 0,
                 source: str | None = None):
        if reader is None and source is None:
            reader, source = default_reader(index)
        self.reader, self.source = reader, source or "custom"
        self.interval_s = interval_s
        self.baseline: int | None = None
        self.peak: int | None = None
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        try:
            used = self.reader()
        except Exception:  # noqa: BLE001 - a failed read is counted, never fatal to the part being measured
            self.errors += 1
            return
        self.samples += 1
        if self.baseline is None:
            self.baseline = used
        self.peak = used if self.peak is None else max(self.peak, used)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def start(self) -> "DeviceMemorySampler":
        if self.reader is not None:
            self._read()
            self._thread = threading.Thread(target=self._run, name="device-memory-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._read()  # the state at the end

    def __enter__(self) -> "DeviceMemorySampler":
        return self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    @property
    def peak_gib(self) -> float | None:
        return None if self.peak is None else self.peak / GiB

    @property
    def baseline_gib(self) -> float | None:
        return None if self.baseline is None else self.baseline / GiB

    def report(self, prefix: str = "device") -> dict:
        """The figures for a part's JSON line (None where nothing was sampled)."""
        return {f"{prefix}_memory_source": self.source, f"{prefix}_peak_gib": self.peak_gib,
                f"{prefix}_baseline_gib": self.baseline_gib,
                f"{prefix}_added_gib": None if self.peak is None else (self.peak - self.baseline) / GiB,
                f"{prefix}_samples": self.samples}


if __name__ == "__main__":  # a quick look: the device's used memory now, and over one second
    with DeviceMemorySampler() as m:
        time.sleep(1.0)
    print(m.report())
