"""Running one dvc.yaml stage through DVC, so DVC decides what is up to date and records the lock.

The Prefect flow calls this for each stage; so can anything else that orchestrates (no Prefect here).
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from protege.tracking import PARENT_ENV


class StageFailed(RuntimeError):
    def __init__(self, stage: str, returncode: int, tail: list[str]):
        self.stage, self.returncode, self.tail = stage, returncode, tail
        detail = "\n".join(tail[-15:])
        super().__init__(f"stage '{stage}' failed (exit {returncode}):\n{detail}")


def stage_outs(project_dir: Path, stage: str) -> list[str]:
    spec = yaml.safe_load((Path(project_dir) / "dvc.yaml").read_text())["stages"][stage]
    outs = []
    for key in ("outs", "metrics"):
        for o in spec.get(key, []):
            outs.append(next(iter(o)) if isinstance(o, dict) else o)
    return outs


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
    cmd = [sys.executable, "-m", "dvc", "repro", "--single-item", stage]
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(cmd, cwd=project_dir, env=stage_env(parent_run_id), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:  # stream progress to the user, keep the tail for the error
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))
    if proc.returncode != 0:
        raise StageFailed(stage, proc.returncode, list(tail))
    return stage_outs(project_dir, stage)


def headline_metrics(project_dir: str | Path) -> dict[str, float]:
    """The evaluation's headline figures, for the pipeline's parent run (empty before `evaluate` has run)."""
    path = Path(project_dir) / "reports" / "eval.json"
    if not path.exists():
        return {}
    report = json.loads(path.read_text())
    out = {}
    for name, m in report.get("models", {}).items():
        out[f"{name}.average"] = m["average"]
        if "world_test" in m:
            out[f"{name}.world_test.accuracy"] = m["world_test"]["accuracy"]
    return out


def missing_dag_params(project_dir: str | Path, params_file: str = "params.yaml") -> list[str]:
    """Keys that dvc.yaml tracks but the params file leaves to defaults (DVC refuses to run those stages)."""
    project_dir = Path(project_dir)
    from protege.config import read_params

    params, _ = read_params(project_dir / params_file)
    stages = yaml.safe_load((project_dir / "dvc.yaml").read_text())["stages"]
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
