"""Running one dvc.yaml stage through DVC, so DVC decides what is up to date and records the lock.

The Prefect flow calls this for each stage; so can anything else that orchestrates (no Prefect here).

Stages of independent branches (the question chain, the agent game, the tool game) can run at the same time
(`orchestration.jobs`). DVC holds one lock per workspace for a whole `dvc repro`, so a stage run next to
another does what `dvc repro --single-item` does in three steps, only the first and last under the lock:
ask DVC whether the stage changed (`dvc status`), run its command (its non-persistent outputs removed first,
as DVC does), and record it (`dvc commit`: the outputs cached and the lock entry written). The outputs are
the same files either way; only the time differs. Which ready stage starts first follows how long each
stage is expected to take (`expected_seconds`): the longest remaining chain first.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from protege.dvc_lockfile import dvc_writing, parse_dvc_file, read_dvc_lock, read_dvc_yaml
from protege.files import write_atomic
from protege.tracking import PARENT_ENV


class StageFailed(RuntimeError):
    def __init__(self, stage: str, returncode: int, tail: list[str]):
        self.stage, self.returncode, self.tail = stage, returncode, tail
        detail = "\n".join(tail[-15:])
        super().__init__(f"stage '{stage}' failed (exit {returncode}):\n{detail}")


def stage_outs(project_dir: Path, stage: str) -> list[str]:
    spec = read_dvc_yaml(project_dir)[stage]
    return [entry_path(o) for key in ("outs", "metrics") for o in spec.get(key, [])]


def entry_path(entry) -> str:
    """The path of a dvc.yaml deps/outs entry (a string, or a one-key mapping with its options)."""
    return str(next(iter(entry)) if isinstance(entry, dict) else entry)


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def stage_upstream(project_dir: str | Path, stages) -> dict[str, list[str]]:
    """For each of `stages` (dvc.yaml's order), the stages among them that write one of its deps."""
    spec = read_dvc_yaml(project_dir)
    outs = {s: [entry_path(o) for key in ("outs", "metrics") for o in spec[s].get(key, [])] for s in stages}
    return {s: [u for u in stages if u != s and any(_overlaps(entry_path(d), o) for d in spec[s].get("deps", [])
                                                    for o in outs[u])] for s in stages}


def stage_env(parent_run_id: str | None) -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)  # so `protege` and `dvc` of this environment are found
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # stage progress reaches the user as it happens
    if parent_run_id:
        env[PARENT_ENV] = parent_run_id
    return env


def repro_stage(project_dir: str | Path, stage: str, parent_run_id: str | None = None) -> list[str]:
    """`dvc repro --single-item STAGE`: runs the stage only if its deps or params changed."""
    project_dir = Path(project_dir).resolve()
    _stream([sys.executable, "-m", "dvc", "repro", "--single-item", stage], project_dir, parent_run_id, stage)
    return stage_outs(project_dir, stage)


def descendants(upstream: dict[str, list[str]]) -> dict[str, set[str]]:
    """For each stage, every stage that (transitively) waits for it."""
    below: dict[str, set[str]] = {s: set() for s in upstream}
    for stage in reversed(list(upstream)):  # dvc.yaml order is topological: later stages are done first
        for up in upstream[stage]:
            below[up] |= {stage} | below[stage]
    return below


def bottom_levels(upstream: dict[str, list[str]], seconds: dict[str, float]) -> dict[str, float]:
    """For each stage, its expected seconds plus those of the costliest chain of stages waiting below it: how
    long the run lasts at least once it starts (0 for a stage with no estimate)."""
    level: dict[str, float] = {}
    for stage in reversed(list(upstream)):  # dvc.yaml order is topological
        below = [level[s] for s in upstream if stage in upstream[s]]
        level[stage] = seconds.get(stage, 0.0) + max(below, default=0.0)
    return level


def run_dag(upstream: dict[str, list[str]], run_one: Callable[[str], object], jobs: int,
            seconds: dict[str, float] | None = None) -> dict[str, object]:
    """run_one(stage) for every stage of `upstream` (in dvc.yaml's order) once the stages it waits for are done,
    at most `jobs` at once. A free slot goes to the ready stage heading the longest expected chain (`seconds`:
    each stage's expected duration, see `expected_seconds`), then to the one with the most stages waiting below
    it, then in dvc.yaml's order; decided here rather than by whichever thread asks first. A failed stage's
    downstream stages never start, the others run to the end; then the first failure in dvc.yaml's order is
    raised. Each call runs in a copy of the caller's context (so an orchestrator's run context reaches it)."""
    order = list(upstream)
    below = descendants(upstream)
    level = bottom_levels(upstream, seconds or {})
    done: dict[str, object] = {}
    failed: dict[str, BaseException] = {}
    running: dict[concurrent.futures.Future, str] = {}
    blocked: set[str] = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        while True:
            ready = [s for s in order if s not in done and s not in failed and s not in blocked
                     and s not in running.values() and all(u in done for u in upstream[s])]
            ready.sort(key=lambda s: (-level[s], -len(below[s]), order.index(s)))
            while ready and len(running) < jobs:
                stage = ready.pop(0)
                running[pool.submit(contextvars.copy_context().run, run_one, stage)] = stage
            if not running:
                break
            finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                stage = running.pop(future)
                if future.exception() is not None:
                    failed[stage] = future.exception()
                    blocked |= below[stage]
                else:
                    done[stage] = future.result()
    if failed:
        raise failed[min(failed, key=order.index)]
    return done


def _dvc(project_dir: Path, *args: str) -> str:
    with dvc_writing(project_dir):
        proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project_dir, env=stage_env(None),
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args)} failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc.stdout


def _stream(cmd, project_dir: Path, parent_run_id: str | None, stage: str, shell: bool = False) -> None:
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(cmd, cwd=project_dir, env=stage_env(parent_run_id), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1, shell=shell) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # stream progress to the user, keep the tail for the error
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))
    if proc.returncode != 0:
        raise StageFailed(stage, proc.returncode, list(tail))


def stage_changed(project_dir: str | Path, stage: str) -> bool:
    """Whether DVC would run STAGE now (its deps, params or outputs differ from dvc.lock); its upstream stages
    are taken as they are. A stage dvc.lock has no record of, or one whose outs are missing, runs for certain:
    that is answered without starting DVC (2.4 s a stage on a fresh project)."""
    project_dir = Path(project_dir).resolve()
    text = read_dvc_lock(project_dir)
    recorded = (parse_dvc_file(text) or {}).get("stages", {}) if text is not None else {}
    outs = [entry_path(o) for o in read_dvc_yaml(project_dir)[stage].get("outs") or []]
    if stage not in recorded or any(not (project_dir / o).exists() for o in outs if "${" not in o):
        return True
    return bool(json.loads(_dvc(project_dir, "status", "--json", stage) or "{}"))


SECONDS_FILE = Path(".dvc") / "tmp" / "protege-stage-seconds.json"
_SECONDS = threading.Lock()


def expected_seconds(project_dir: str | Path) -> dict[str, float]:
    """How long each stage is expected to take: what its last run in this project took (recorded in
    SECONDS_FILE), else dvc.yaml's `meta: {seconds: N}` hint (the demo's time on 2 CPU cores)."""
    project_dir = Path(project_dir)
    spec = read_dvc_yaml(project_dir)
    hints = {s: (v.get("meta") or {}).get("seconds") for s, v in spec.items()}
    out = {s: float(h) for s, h in hints.items() if isinstance(h, (int, float))}
    recorded = project_dir / SECONDS_FILE
    try:
        out.update({s: float(v) for s, v in json.loads(recorded.read_text()).items() if s in spec})
    except (OSError, ValueError, AttributeError):
        pass  # none recorded yet, or a file this version cannot read: the hints stand
    return out


def _record_seconds(project_dir: Path, stage: str, seconds: float) -> None:
    recorded = project_dir / SECONDS_FILE
    if not recorded.parent.parent.is_dir():
        return
    with _SECONDS:
        try:
            known = json.loads(recorded.read_text())
        except (OSError, ValueError):
            known = {}
        known = {**(known if isinstance(known, dict) else {}), stage: round(seconds, 1)}
        recorded.parent.mkdir(exist_ok=True)
        write_atomic(recorded, lambda tmp: tmp.write_text(json.dumps(known, indent=1, sort_keys=True)))


def run_stage_beside_others(project_dir: str | Path, stage: str, parent_run_id: str | None = None) -> list[str]:
    """`dvc repro --single-item STAGE` without holding DVC's workspace lock while the stage's command runs, so
    a stage of another branch can run meanwhile (see the module docstring)."""
    project_dir = Path(project_dir).resolve()
    if not stage_changed(project_dir, stage):
        print(f"Stage '{stage}' didn't change, skipping", flush=True)
        return stage_outs(project_dir, stage)
    spec = read_dvc_yaml(project_dir)[stage]
    for key in ("outs", "metrics", "plots"):
        for o in spec.get(key, []):
            if isinstance(o, dict) and (next(iter(o.values())) or {}).get("persist"):
                continue
            target = project_dir / entry_path(o)
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    print(f"Running stage '{stage}':\n> {spec['cmd']}", flush=True)
    t0 = time.monotonic()
    _stream(spec["cmd"], project_dir, parent_run_id, stage, shell=True)
    _record_seconds(project_dir, stage, time.monotonic() - t0)
    _dvc(project_dir, "commit", "--force", "--quiet", stage)
    return stage_outs(project_dir, stage)


def headline_metrics(project_dir: str | Path) -> dict[str, float]:
    """The evaluation's headline figures, for the pipeline's parent run (empty before `evaluate` has run)."""
    path = Path(project_dir) / "reports" / "eval.json"
    if not path.exists():
        return {}
    report = json.loads(path.read_text())
    out = {}
    for name, m in report.get("models", {}).items():
        if m.get("average") is not None:
            out[f"{name}.average"] = m["average"]
        if "world_test" in m:
            out[f"{name}.world_test.accuracy"] = m["world_test"]["accuracy"]
    return out


def missing_dag_params(project_dir: str | Path, params_file: str = "params.yaml") -> list[str]:
    """Keys that dvc.yaml tracks but the params file leaves to defaults (DVC refuses to run those stages)."""
    project_dir = Path(project_dir)
    from protege.config import read_params

    params, _ = read_params(project_dir / params_file)
    stages = read_dvc_yaml(project_dir)
    missing = []
    for spec in stages.values():
        for key in spec.get("params", []):
            node = params
            for part in str(key).split("."):
                if not isinstance(node, dict) or part not in node:
                    missing.append(str(key))
                    break
                node = node[part]
    return sorted(set(missing))


def dvc_add(project_dir: str | Path, rel: str | Path) -> None:
    """`dvc add REL`: versions a folder no stage writes (the retraining pool, the exported champion)."""
    project_dir = Path(project_dir).resolve()
    with dvc_writing(project_dir):
        proc = subprocess.run([sys.executable, "-m", "dvc", "add", str(rel)], cwd=project_dir,
                              env=stage_env(None), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"dvc add {rel} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()}")


def set_param(project_dir: str | Path, key: str, value, params_file: str = "params.yaml") -> bool:
    """Sets a dotted key in the params file, keeping its comments and layout (as `dvc exp run -S` does);
    returns whether the value changed. The result is checked like any params file before it replaces it."""
    from ruamel.yaml import YAML

    from protege.config import ConfigError, load_config
    from protege.files import write_atomic

    path = Path(project_dir) / params_file
    yaml_rt = YAML()
    yaml_rt.preserve_quotes = True
    data = yaml_rt.load(path.read_text())
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    if node.get(leaf) == value:
        return False
    node[leaf] = value
    tmp = path.with_name(f".{path.name}.check")
    with open(tmp, "w") as f:
        yaml_rt.dump(data, f)
    try:
        load_config(tmp)
    except ConfigError as exc:  # name the user's file, not the hidden copy checked
        raise ConfigError(str(exc).replace(str(tmp), str(path)).replace(tmp.name, path.name)) from None
    finally:
        text = tmp.read_text()
        tmp.unlink()
    write_atomic(path, lambda t: t.write_text(text))
    return True
