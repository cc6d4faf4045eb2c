"""The NVIDIA driver against the CUDA version torch (and the vLLM built for that torch) was compiled with: the
GPU check's first part, so that an old driver fails with a sentence instead of a CUDA error deep in vLLM.

A CUDA 12.x or 13.x build runs on a driver whose own CUDA version (what `nvidia-smi` prints in its header,
cuDriverGetVersion) is at least the build's. An older driver of the same major version still runs it under
CUDA's minor version compatibility (at least 525.60.13 for 12.x, 580.65.06 for 13.x, 450.80.02 for 11.x), but
without PTX JIT: every kernel must be prebuilt for the GPU (pip wheels of torch and vLLM are; a note says so).
Older than that, the check fails.

    python benchmarks/gpu_driver.py                              # reads nvidia-smi / libcuda and torch
    python benchmarks/gpu_driver.py --driver 535.104.05 --driver-cuda 12.2 --torch-cuda 13.0   # what-if (smoke)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import subprocess
import sys

# CUDA's minor version compatibility: the oldest Linux driver that runs any build of this CUDA major version
MINOR_COMPAT_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def smi_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[0] if lines else None


def driver_cuda() -> str | None:
    """The CUDA version the installed driver supports, from libcuda (cuDriverGetVersion), else nvidia-smi's header."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    if shutil.which("nvidia-smi"):
        try:
            head = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        m = re.search(r"CUDA Version:\s*([0-9.]+)", head)
        return m.group(1) if m else None
    return None


def torch_cuda() -> tuple[str | None, str]:
    try:
        import torch
    except ImportError:
        return None, "not installed"
    return torch.version.cuda, torch.__version__


def judge(driver: str | None, drv_cuda: str | None, build_cuda: str | None) -> tuple[bool, str]:
    """(ok, sentence) for a driver (version, CUDA version it supports) and a build's CUDA version."""
    if build_cuda is None:
        return False, "torch is a CPU build (torch.version.cuda is None): install the CUDA build"
    if driver is None and drv_cuda is None:
        return False, "no NVIDIA driver found (nvidia-smi and libcuda.so.1 missing)"
    need = version_tuple(build_cuda)[:2]
    if drv_cuda is not None and version_tuple(drv_cuda)[:2] >= need:
        return True, f"driver {driver} supports CUDA {drv_cuda} >= the build's CUDA {build_cuda}"
    floor = MINOR_COMPAT_FLOOR.get(need[0])
    same_major = drv_cuda is None or version_tuple(drv_cuda)[0] == need[0]
    if driver is not None and floor is not None and same_major and version_tuple(driver) >= version_tuple(floor):
        return True, (f"driver {driver} (CUDA {drv_cuda}) is older than the build's CUDA {build_cuda} but runs it "
                      f"under minor version compatibility (>= {floor}): no PTX JIT, prebuilt kernels only")
    wanted = f">= {floor} (CUDA {need[0]}.x minor version compatibility)" if floor else f"for CUDA {build_cuda}"
    return False, (f"the NVIDIA driver {driver} supports CUDA {drv_cuda}, older than the CUDA {build_cuda} torch and "
                   f"vLLM were built with: install a driver {wanted}, or a torch / vLLM build for CUDA <= {drv_cuda}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", help="driver version (default: nvidia-smi's)")
    ap.add_argument("--driver-cuda", help="the CUDA version the driver supports (default: libcuda / nvidia-smi)")
    ap.add_argument("--torch-cuda", help="the CUDA version of the build (default: torch.version.cuda)")
    args = ap.parse_args(argv)
    driver = args.driver or smi_driver()
    drv_cuda = args.driver_cuda or driver_cuda()
    build_cuda, torch_version = (args.torch_cuda, "(what-if)") if args.torch_cuda else torch_cuda()
    ok, why = judge(driver, drv_cuda, build_cuda)
    vllm_version = None
    try:
        import importlib.metadata

        vllm_version = importlib.metadata.version("vllm")
    except Exception:  # noqa: BLE001 - vLLM is optional (the offline check has none)
        pass
    print(json.dumps({"part": "driver", "ok": ok, "driver": driver, "driver_cuda": drv_cuda, "torch": torch_version,
                      "torch_cuda": build_cuda, "vllm": vllm_version, "why": why}), flush=True)
    if not ok:
        print(f"gpu_driver: FAILED: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
