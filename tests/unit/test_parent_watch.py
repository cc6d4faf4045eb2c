"""A child whose parent is killed stops by itself (what keeps a killed study's run from writing on)."""
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = ("from protege.runtime.parent_watch import exit_with_parent\n"
         "import time\nexit_with_parent(poll_s=0.1)\ntime.sleep(60)\n")
# the parent starts the child, reports its pid, then dies without waiting (as a SIGKILLed study would)
PARENT = ("import subprocess, sys, os, time\n"
          f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], stdout=subprocess.DEVNULL)\n"
          "print(child.pid, flush=True)\ntime.sleep(0.5)\nos._exit(0)\n")


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    if not Path("/proc/self").exists():  # no procfs (macOS): signal 0 only asks whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        state = next(ln for ln in status.read_text().splitlines() if ln.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return " Z " not in state and "zombie" not in state  # a zombie has exited and awaits its reaper


def test_a_child_ends_when_its_parent_dies():
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))
    pid = int(out.stdout.split()[0])
    deadline = time.time() + 20
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the child outlived its parent by 20 s"


def test_a_child_with_its_parent_alive_runs_on():
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=dict(os.environ, PYTHONPATH=str(
        Path(__file__).resolve().parents[2])))
    try:
        time.sleep(1.5)  # 15 polls
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
