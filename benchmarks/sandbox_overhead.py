"""Cost of the sandbox per execution: `print(1)` N times through Sandbox (bubblewrap), through Sandbox in
unsafe mode, and as a plain `subprocess.run([python, -I, -c, ...])`, one after another; prints the median
and p90 wall milliseconds of each and the overhead over a plain run.

The plain runs use the same real interpreter the sandbox runs (not the venv's). `-I` still imports site
(and runs every .pth file of the installation's site-packages), which the sandbox's -S skips, so a second
plain run with the sandbox's flags (-S -s -B) is the baseline: the difference to it is the sandbox's own
work (temp dir, pids cgroup, launch shell, bwrap's namespaces and mounts, setpriv).

    .venv/bin/python benchmarks/sandbox_overhead.py [--runs 50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from protege.tools.sandbox import Sandbox, SandboxUnavailable

CODE = "print(1)"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def plain(python: str, flags: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        res = subprocess.run([python, *flags, "-c", CODE], capture_output=True, env={"PATH": "/usr/bin:/bin"})
        out.append((time.perf_counter() - t0) * 1000)
        assert res.stdout == b"1\n", res
    return out


def sandboxed(box: Sandbox, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        res = box.run(CODE)
        out.append((time.perf_counter() - t0) * 1000)
        assert res.ok and res.stdout == "1\n", res
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    python = os.path.realpath(sys.executable)
    rows = []
    try:
        box = Sandbox()
        rows.append((f"Sandbox (bubblewrap, cap {box.process_cap})", sandboxed(box, args.runs)))
    except SandboxUnavailable as exc:
        print(f"bubblewrap: not measured ({exc})")
    unsafe = Sandbox(unsafe=True)
    rows.append((f"Sandbox (unsafe, cap {unsafe.process_cap})", sandboxed(unsafe, args.runs)))
    rows.append(("plain subprocess.run(python -I -c)", plain(python, ["-I"], args.runs)))
    rows.append(("plain subprocess.run(python -S -s -B -c)", plain(python, ["-S", "-s", "-B"], args.runs)))
    base = statistics.median(rows[-1][1])
    print(f"{args.runs} runs of {CODE!r} each, interpreter {python}")
    print(f"{'':<42} {'median ms':>10} {'p90 ms':>8}   median vs the last row")
    for name, ms in rows:
        med = statistics.median(ms)
        print(f"{name:<42} {med:10.1f} {pct(ms, 0.9):8.1f} {med - base:+13.1f} ms ({med / base:4.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
