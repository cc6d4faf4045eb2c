"""Evaluating a registered model version: its checkpoint is exported from the registry and scored by
`protege eval run` (the same suite, protocol and MLflow logging as any checkpoint)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from protege.errors import UserFacingError

URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>\d+))$")


def parse_model_uri(uri: str) -> tuple[str, str]:
    """models:/NAME@ALIAS or models:/NAME/VERSION -> (NAME, ALIAS or VERSION)."""
    m = URI.match(uri.strip())
    if not m:
        raise UserFacingError(f"model URI {uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    return m["name"], m["alias"] or m["version"]


def evaluate_model_version(project_dir: Path, model_uri: str, benchmarks: str = "all") -> Path:
    from protege.pipeline import stage_env
    from protege.tracking import export_model_version

    name, ref = parse_model_uri(model_uri)
    staging = Path(project_dir) / "reports" / "registry-eval" / f".{name}-{ref}"
    version = export_model_version(project_dir, name, ref, staging)
    if version is None:
        raise UserFacingError(f"{model_uri}: no such registered model version")
    out = Path(project_dir) / "reports" / "registry-eval" / f"{name}-v{version}"
    checkpoint = out / "checkpoint"
    out.mkdir(parents=True, exist_ok=True)
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
    staging.rename(checkpoint)
    cmd = [sys.executable, "-m", "protege", "eval", "run", "--model", str(checkpoint), "--out", str(out),
           "--name", f"{name}-v{version}", "--benchmarks", benchmarks]
    proc = subprocess.run(cmd, cwd=project_dir, env=stage_env(None))
    if proc.returncode != 0:
        raise RuntimeError(f"evaluating {model_uri} (v{version}) failed (exit {proc.returncode})")
    return out / "report.md"
