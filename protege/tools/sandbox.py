"""Runs model-written Python in a throwaway process: this module is a security boundary.

Every execution gets its own process tree, a fresh folder (its cwd and HOME, the only writable place,
removed afterwards: under bubblewrap a tmpfs of `disk_mb` at /sandbox holding the program read-only, in
unsafe mode a host temp dir) and these limits (`Limits`):

- wall clock: the whole tree is killed at `timeout_s` (`exit_code` None, limit "timeout");
- RLIMIT_CPU (SIGXCPU at `cpu_s`, SIGKILL a second later), RLIMIT_AS (`memory_mb`), RLIMIT_FSIZE
  (`file_mb`), no core files;
- a cap on processes + threads (`nproc`) that binds for root too: a per-execution pids cgroup (v1,
  /sys/fs/cgroup/pids/protege-sandbox/<unique>), else RLIMIT_NPROC under a uid of its own
  (`Sandbox.process_cap` says which: "cgroup", "rlimit", or None in unsafe mode when neither works);
- stdout keeps its first `output_bytes`, stderr its last (where the exception is); past a generous
  drain allowance the program is killed so that gigabytes of output never reach our memory.

Isolation (isolation="bubblewrap"): bwrap with new pid, net, ipc, uts and cgroup namespaces, no
capabilities, `--die-with-parent`, `--new-session`, a cleared environment; the filesystem is /usr and
the interpreter's installation read-only (its site-packages masked), minimal /proc and /dev, the
program's tmpfs at /sandbox, and nothing else (no /etc, /home, /root, /work, /tmp). As root, user namespaces are
NOT unshared (unlike `--unshare-all`): bwrap can only map the sandbox uid to our own uid 0, and a
capability-less kuid 0 still writes root-owned sysctls; instead the program is dropped with setpriv to
a real unprivileged uid (nobody, or one uid per concurrent execution under the rlimit cap). As
another user, bwrap runs unprivileged with every namespace unshared.

unsafe=True keeps the process, limits, clean environment and temp dir but no isolation at all.

The interpreter runs with -S -s -B: no site (so no .pth files and no exit()/quit() builtins: use
sys.exit) and no user site; -E is not used because the environment is ours (PATH, HOME, LANG=C.UTF-8,
PYTHONDONTWRITEBYTECODE=1, PYTHONHASHSEED=0, MALLOC_ARENA_MAX=1) and PYTHONHASHSEED=0 is meant to apply.
"""
from __future__ import annotations

import itertools
import math
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PIDS_ROOT = Path("/sys/fs/cgroup/pids/protege-sandbox")
INSIDE = "/sandbox"          # where the temp dir appears inside bubblewrap
NOBODY = 65534
SLOT_UID_BASE = 64000        # rlimit cap as root: RLIMIT_NPROC counts per uid, so each running execution gets its own
SLOT_COUNT = 512
BWRAP_TASKS = 2              # outer bwrap + its pid-1 init live in the execution's cgroup too
DRAIN_BYTES = 1 << 20        # output read (and dropped) past the cap before the program is killed
INSTALL_HINT = ("no working bubblewrap (bwrap) to isolate model-written code: install it (apt-get install "
                "bubblewrap) or, only on a machine you do not mind it damaging, set unsafe (Sandbox(unsafe=True), "
                "tool.sandbox.unsafe: true, or --unsafe)")
PY_FLAGS = ["-S", "-s", "-B"]
NPROC_MARKERS = ("BlockingIOError", "Resource temporarily unavailable", "can't start new thread")
MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory")

# The first process of each execution: joins the cgroup before anything else can fork, sets the rlimits,
# then becomes the real command. A shell rather than preexec_fn, which is unsafe with threads.
# ulimit -u is bash's RLIMIT_NPROC and -p dash's.
_LAUNCH = r'''cg=$1
if [ -n "$cg" ]; then echo $$ > "$cg" || exit 125; fi
ulimit -c 0 && ulimit -S -t "$2" && ulimit -H -t "$3" && ulimit -v "$4" && ulimit -f "$5" || exit 125
if [ -n "$6" ]; then { ulimit -u "$6" 2>/dev/null || ulimit -p "$6"; } || exit 125; fi
shift 6
exec "$@"'''
_INNER_NPROC = r'''{ ulimit -u "$1" 2>/dev/null || ulimit -p "$1"; } || exit 125
shift
exec "$@"'''


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0        # wall clock
    cpu_s: int = 5                # RLIMIT_CPU
    memory_mb: int = 512          # RLIMIT_AS of each process (a bare python needs ~20 MB of address space)
    nproc: int = 16               # processes + threads of the program (its main thread counts)
    output_bytes: int = 4096      # stdout and stderr each truncated to this
    file_mb: int = 16             # RLIMIT_FSIZE: largest file the program can write
    disk_mb: int = 64             # all it can write: its folder is a tmpfs of this size (bubblewrap only)

    def __post_init__(self) -> None:
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= 3600:
            raise ValueError(f"Limits.timeout_s must be a number of seconds in (0, 3600], got {t!r}")
        for name, lo, hi in (("cpu_s", 1, 3600), ("memory_mb", 32, 1_000_000), ("nproc", 1, 100_000),
                             ("output_bytes", 1, 100_000_000), ("file_mb", 0, 1_000_000), ("disk_mb", 1, 1_000_000)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"Limits.{name} must be an integer in [{lo}, {hi}], got {v!r}")


@dataclass
class Outcome:
    stdout: str
    stderr: str
    exit_code: int | None         # None when killed by the wall-clock timeout; -N when killed by signal N
    limit: str | None             # "timeout" | "cpu" | "memory" | "nproc" | "output" | None
    ms: float                     # wall milliseconds of the execution
    isolation: str                # "bubblewrap" or "unsafe"

    @property
    def ok(self) -> bool:
        """Exit 0 and no limit hit, except that truncated output alone ("output" with exit 0) stays ok:
        the program finished, only its output was cut."""
        return self.exit_code == 0 and self.limit in (None, "output")

    @property
    def error(self) -> bool:
        """What the trainer counts as a runtime error."""
        return not self.ok

    def tool_text(self, max_chars: int = 400) -> str:
        """The tool turn the model reads: stdout when ok, else one short "Error: ..." line; never longer
        than max_chars."""
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"max_chars must be a positive integer, got {max_chars!r}")
        if self.ok:
            text = self.stdout + ("\n[output truncated]" if self.limit == "output" else "")
        else:
            text = "Error: " + self._error_message()
        return text if len(text) <= max_chars else text[:max_chars - 1] + "…"

    def _error_message(self) -> str:
        last = _last_line(self.stderr)
        if self.limit == "timeout":
            # rounded down: the kill itself takes a few ms past the limit
            return f"timeout after {math.floor(self.ms / 100) / 10:.1f} s"
        if self.limit == "cpu":
            return "CPU time limit exceeded"
        if self.limit == "memory":
            return "memory limit exceeded"
        if self.limit == "nproc":
            return "process limit exceeded (too many processes or threads)"
        if self.limit == "output" and self.exit_code == -signal.SIGKILL:
            return "output limit exceeded (program killed)"
        if last:
            return last
        if self.exit_code is not None and self.exit_code < 0:
            return f"killed by signal {_signal_name(-self.exit_code)}"
        return f"exit status {self.exit_code}"

    def to_json(self) -> dict:
        return {"stdout": self.stdout, "stderr": self.stderr, "exit_code": self.exit_code, "limit": self.limit,
                "ms": round(self.ms, 3), "isolation": self.isolation}


class SandboxUnavailable(RuntimeError):
    pass


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return str(num)


def _bubblewrap_ns_args() -> list[str]:
    if os.geteuid() == 0:
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all"]


def _system_fs_args() -> list[str]:
    """/usr read-only plus the top-level /bin, /lib* links (or folders, before merged /usr)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


_probe_lock = threading.Lock()
_probed: dict[str, bool] = {}


def isolation_tool() -> str | None:
    """Path of a working bwrap, else None; each bwrap found is tried once (a sandbox running `true`)."""
    found = shutil.which("bwrap")
    if found is None:
        return None
    path = os.path.realpath(found)
    with _probe_lock:
        if path not in _probed:
            argv = [path, *_bubblewrap_ns_args(), "--die-with-parent", "--new-session", "--clearenv",
                    *_system_fs_args(), "--proc", "/proc", "--dev", "/dev", "--", "true"]
            try:
                res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, timeout=30, env={"PATH": "/usr/bin:/bin"})
                _probed[path] = res.returncode == 0
            except (OSError, subprocess.SubprocessError):
                _probed[path] = False
        return path if _probed[path] else None


_cgroup_lock = threading.Lock()
_cgroup_state: list[bool] = []
_cgroup_counter = itertools.count()


def _pids_cgroup_usable() -> bool:
    """Whether we can create pids cgroups (v1) under PIDS_ROOT; tried once per process."""
    with _cgroup_lock:
        if not _cgroup_state:
            ok = False
            try:
                if (PIDS_ROOT.parent / "cgroup.procs").exists():
                    PIDS_ROOT.mkdir(exist_ok=True)
                    _remove_stale_cgroups()
                    probe = _PidsCgroup(1)
                    probe.destroy()
                    ok = True
            except OSError:
                ok = False
            _cgroup_state.append(ok)
        return _cgroup_state[0]


def _remove_stale_cgroups() -> None:
    """Empty cgroups left by a process that died mid-run (named after its pid); rmdir refuses non-empty ones."""
    for child in PIDS_ROOT.iterdir():
        owner = child.name.split("-", 1)[0]
        if not child.is_dir() or not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            try:
                child.rmdir()
            except OSError:
                pass
        except OSError:
            pass


class _PidsCgroup:
    def __init__(self, limit: int) -> None:
        self.path = PIDS_ROOT / f"{os.getpid()}-{next(_cgroup_counter)}-{secrets.token_hex(4)}"
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(limit))
        except OSError:
            self.path.rmdir()
            raise

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def hits(self) -> int:
        """Forks refused because pids.max was reached."""
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill_all(self, patience_s: float = 5.0) -> None:
        # a tree that is still forking refills the list, hence the loop; pids.max bounds it
        end = time.monotonic() + patience_s
        while time.monotonic() < end:
            try:
                pids = [int(p) for p in Path(self.procs_file).read_text().split()]
            except (OSError, ValueError):
                return
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def destroy(self) -> None:
        self.kill_all()
        end = time.monotonic() + 5.0
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                # EBUSY until the killed tasks are fully gone
                if time.monotonic() > end:
                    raise
                time.sleep(0.01)


class _UidSlots:
    """Distinct uids for executions running at once, so that RLIMIT_NPROC (counted per uid) is per execution."""

    def __init__(self) -> None:
        self._free = list(range(SLOT_UID_BASE + SLOT_COUNT - 1, SLOT_UID_BASE - 1, -1))
        self._cond = threading.Condition()

    def take(self) -> int:
        with self._cond:
            while not self._free:
                self._cond.wait()
            return self._free.pop()

    def give(self, uid: int) -> None:
        with self._cond:
            self._free.append(uid)
            self._cond.notify()


_uid_slots = _UidSlots()
_launch_lock = threading.Lock()
_launch_checked: set[tuple] = set()


def _interpreter() -> tuple[str, str]:
    """(the real interpreter binary, its installation prefix), never a venv's (its pyvenv.cfg would pull
    the venv's site-packages in)."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not exe or not os.access(exe, os.X_OK):
        raise SandboxUnavailable(f"no runnable python interpreter (sys.executable={sys.executable!r})")
    return exe, prefix


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _rmtree(path: str) -> None:
    def unlock(func, p, _exc):
        # the program may have chmod-ed its own folders shut (it is dead by now, so the links checked here
        # cannot change: chmod follows links, and one could point anywhere)
        try:
            for target in (os.path.dirname(p), p):
                if not os.path.islink(target):
                    os.chmod(target, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)


class Sandbox:
    """Runs Python source, one fresh process and temp dir per call; thread-safe.

    `isolation` is "bubblewrap" or "unsafe"; `process_cap` is how nproc is enforced: "cgroup" (pids cgroup),
    "rlimit" (RLIMIT_NPROC under a uid of the execution's own) or None (unsafe mode where neither binds).
    Raises SandboxUnavailable when bubblewrap is missing or cannot run python here (unless unsafe)."""

    def __init__(self, limits: Limits = Limits(), unsafe: bool = False) -> None:
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a Limits, got {type(limits).__name__}")
        self.limits = limits
        self.unsafe = bool(unsafe)
        self.isolation = "unsafe" if self.unsafe else "bubblewrap"
        self._python, self._prefix = _interpreter()
        self._root = os.geteuid() == 0
        self._bwrap = None
        self._setpriv = None
        if not self.unsafe:
            self._bwrap = isolation_tool()
            if self._bwrap is None:
                raise SandboxUnavailable(INSTALL_HINT)
            if self._root:
                found = shutil.which("setpriv", path="/usr/bin:/bin")
                self._setpriv = os.path.realpath(found) if found else None
                if self._setpriv is None or not _under(self._setpriv, "/usr"):
                    raise SandboxUnavailable("bubblewrap as root needs setpriv (util-linux) in /usr/bin to drop "
                                             "the program to an unprivileged uid")
        if _pids_cgroup_usable():
            self.process_cap: str | None = "cgroup"
        elif not self.unsafe:
            # root: its own uid per execution; another user: RLIMIT_NPROC inside its user namespace
            self.process_cap = "rlimit"
        else:
            # as root RLIMIT_NPROC does not bind, and as another user it would count all that user's processes
            self.process_cap = None
        self._check_launch()

    def run(self, code: str) -> Outcome:
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        return self._execute(code.encode("utf-8", "replace"))

    def run_file(self, path: str | Path) -> Outcome:
        return self._execute(Path(path).read_bytes())

    def _check_launch(self) -> None:
        """Run a trivial program once per configuration, so that a machine that cannot launch fails here
        with the reason instead of every rollout reporting an error."""
        key = (self.isolation, self.process_cap, self._python, self._bwrap)
        with _launch_lock:
            if key in _launch_checked:
                return
        got = self._execute(b"print(6 * 7)\n")
        if got.stdout.strip() != "42" or got.exit_code != 0:
            raise SandboxUnavailable(f"the sandbox ({self.isolation}, process cap {self.process_cap}) cannot run "
                                     f"python: exit {got.exit_code}, limit {got.limit}, stderr "
                                     f"{got.stderr.strip()[-500:]!r}")
        with _launch_lock:
            _launch_checked.add(key)

    def _execute(self, source: bytes) -> Outcome:
        lim = self.limits
        workdir = tempfile.mkdtemp(prefix="protege-sbx-")
        cgroup = None
        uid = None
        try:
            with open(os.path.join(workdir, "main.py"), "wb") as f:
                f.write(source)
            os.chmod(os.path.join(workdir, "main.py"), 0o644)
            if self.process_cap == "cgroup":
                cgroup = _PidsCgroup(lim.nproc + (0 if self.unsafe else BWRAP_TASKS))
            if not self.unsafe and self._root:
                uid = _uid_slots.take() if self.process_cap == "rlimit" else NOBODY
                # owner: the program; group root: bwrap (uid 0 without capabilities) must chdir into it
                os.chown(workdir, uid, 0)
                os.chmod(workdir, 0o770)
            argv, env = self._command(workdir, cgroup, uid)
            return self._spawn(argv, env, workdir, cgroup)
        finally:
            if cgroup is not None:
                cgroup.destroy()
            if uid is not None and uid != NOBODY:
                _uid_slots.give(uid)
            _rmtree(workdir)

    def _command(self, workdir: str, cgroup: _PidsCgroup | None, uid: int | None) -> tuple[list[str], dict]:
        lim = self.limits
        home = workdir if self.unsafe else INSIDE
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0",
               # glibc reserves 64 MB of address space per thread arena: RLIMIT_AS would cap threads, not memory
               "MALLOC_ARENA_MAX": "1"}
        # root's RLIMIT_NPROC is set before bwrap (root ignores it; the dropped uid inherits it); another
        # user's goes inside its user namespace, where only the sandbox's own processes count
        outer_nproc = str(lim.nproc) if self.process_cap == "rlimit" and self._root else ""
        launch = ["/bin/sh", "-c", _LAUNCH, "sh", cgroup.procs_file if cgroup else "", str(lim.cpu_s),
                  str(lim.cpu_s + 1), str(lim.memory_mb * 1024), str(lim.file_mb * 2048), outer_nproc]
        if self.unsafe:
            return launch + [self._python, *PY_FLAGS, os.path.join(workdir, "main.py")], env
        program = [self._python, *PY_FLAGS, f"{INSIDE}/main.py"]
        if self._root:
            program = [self._setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *program]
            caps = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            ids: list[str] = []
        else:
            if self.process_cap == "rlimit":
                # bwrap's init inside the namespace runs under the sandbox uid too
                program = ["/bin/sh", "-c", _INNER_NPROC, "sh", str(lim.nproc + 1), *program]
            caps = ["--cap-drop", "ALL"]
            ids = ["--uid", str(NOBODY), "--gid", str(NOBODY)]
        bwrap = [self._bwrap, *_bubblewrap_ns_args(), *ids, "--die-with-parent", "--new-session", "--clearenv"]
        for key, value in env.items():
            bwrap += ["--setenv", key, value]
        bwrap += [*caps, *_system_fs_args(), *self._interpreter_fs_args(), "--proc", "/proc", "--dev", "/dev",
                  # the program's folder is a tmpfs of disk_mb (RLIMIT_FSIZE caps one file, not how many), gone
                  # with the mount namespace; the program file is bound into it read-only
                  "--perms", "0777", "--size", str(lim.disk_mb << 20), "--tmpfs", INSIDE,
                  "--ro-bind", os.path.join(workdir, "main.py"), f"{INSIDE}/main.py",
                  "--chdir", INSIDE, "--remount-ro", "/dev", "--remount-ro", "/", "--", *program]
        return launch + bwrap, env

    def _interpreter_fs_args(self) -> list[str]:
        prefix = self._prefix
        if any(_under(prefix, "/" + top) for top in ("usr", "bin", "lib", "lib64")):
            return []  # a system python: already there with /usr; -S keeps its dist-packages off sys.path
        args = []
        # bwrap creates missing parents with the host folder's mode (0700 for /root): open them for nobody
        parts = Path(prefix).parts[1:]
        for i in range(1, len(parts)):
            args += ["--perms", "0555", "--dir", "/" + "/".join(parts[:i])]
        args += ["--ro-bind", prefix, prefix]
        site = os.path.join(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
        if os.path.isdir(site):
            args += ["--perms", "0555", "--tmpfs", site, "--remount-ro", site]
        return args

    def _spawn(self, argv: list[str], env: dict, workdir: str, cgroup: _PidsCgroup | None) -> Outcome:
        lim = self.limits
        start = time.monotonic()
        deadline = start + lim.timeout_s
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=workdir, env=env, start_new_session=True, close_fds=True)
        out, err = bytearray(), bytearray()
        dropped = 0
        killed: str | None = None
        sel = selectors.DefaultSelector()
        pidfd = None
        try:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            try:
                pidfd = os.pidfd_open(proc.pid)
                sel.register(pidfd, selectors.EVENT_READ, None)
            except (AttributeError, OSError):
                pidfd = None
            exited = False
            grace_end = None
            while True:
                now = time.monotonic()
                if not exited and now >= deadline:
                    killed = "timeout"
                    break
                if exited and (len(sel.get_map()) == 0 or now >= grace_end):
                    break
                wait = (grace_end if exited else deadline) - now
                if pidfd is None and not exited:
                    wait = min(wait, 0.02)
                dropped += self._read_ready(sel, max(wait, 0), err)
                if dropped > max(DRAIN_BYTES, 16 * lim.output_bytes) and not exited:
                    killed = "output"
                    break
                if not exited and (proc.poll() is not None if pidfd is None else pidfd not in
                                   {k.fd for k in sel.get_map().values()}):
                    exited = True
                    # the program is done: whatever it left behind (unsafe mode) goes now, so the pipes close
                    self._kill_tree(proc, cgroup)
                    grace_end = time.monotonic() + 1.0
            if killed:
                self._kill_tree(proc, cgroup)
            proc.wait()
            ms = (time.monotonic() - start) * 1000
            # what was written before a kill is still in the pipes
            end = time.monotonic() + 0.5
            while sel.get_map() and time.monotonic() < end:
                dropped += self._read_ready(sel, max(end - time.monotonic(), 0), err)
        finally:
            if proc.returncode is None:
                self._kill_tree(proc, cgroup)
                proc.wait()
            sel.close()
            if pidfd is not None:
                os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
        hits = cgroup.hits() if cgroup is not None else None
        code = self._exit_code(proc.returncode)
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        limit = self._limit(killed, code, stderr, dropped > 0, hits, ms)
        return Outcome(stdout, stderr, None if killed == "timeout" else code, limit, ms, self.isolation)

    def _read_ready(self, sel: selectors.BaseSelector, timeout: float, err: bytearray) -> int:
        """One select round: reads every ready pipe into its buffer (`_keep`), unregisters closed pipes and the
        pidfd once it fires (the exit is then seen by the caller's poll); returns the bytes dropped."""
        dropped = 0
        for key, _ in sel.select(timeout):
            if key.data is None:
                sel.unregister(key.fd)
                continue
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
            else:
                dropped += self._keep(key.data, chunk, key.data is err)
        return dropped

    def _keep(self, buf: bytearray, chunk: bytes, tail: bool) -> int:
        """Append within output_bytes (stdout keeps its head, stderr its tail); returns the bytes dropped."""
        cap = self.limits.output_bytes
        if tail:
            buf += chunk
            extra = len(buf) - cap
            if extra > 0:
                del buf[:extra]
                return extra
            return 0
        room = cap - len(buf)
        if room > 0:
            buf += chunk[:room]
        return max(len(chunk) - max(room, 0), 0)

    @staticmethod
    def _kill_tree(proc: subprocess.Popen, cgroup: _PidsCgroup | None) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if cgroup is not None:
            cgroup.kill_all()

    def _exit_code(self, status: int) -> int:
        # bwrap reports a child killed by signal N as exit status 128 + N; Popen as -N
        if not self.unsafe and 128 < status <= 128 + 64:
            return -(status - 128)
        return status

    def _limit(self, killed: str | None, code: int, stderr: str, truncated: bool, hits: int | None,
               ms: float) -> str | None:
        if killed:
            return killed
        if code == -signal.SIGXCPU:
            return "cpu"
        # RLIMIT_CPU's hard limit (a second after an ignored SIGXCPU) is the only SIGKILL we arm; a program
        # killing itself early is not mistaken for it
        if code == -signal.SIGKILL and ms >= 1000 * (self.limits.cpu_s + 1) / max(os.cpu_count() or 1, 1):
            return "cpu"
        if hits is not None:
            if hits > 0:
                return "nproc"
            # the cgroup refused nothing, so a thread that could not start lacked address space for its stack
            if "can't start new thread" in stderr:
                return "memory"
        elif any(m in stderr for m in NPROC_MARKERS):
            return "nproc"
        if any(m in stderr for m in MEMORY_MARKERS):
            return "memory"
        if truncated:
            return "output"
        return None
