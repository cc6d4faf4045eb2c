"""rl_baseline: the rl stage's very run (seed, steps, questions, group size, lr, ...) with `rl.baseline`'s
algorithm (default dr_grpo) instead of `rl.algorithm`, for a comparison under the same budget.

Writes models/rl_baseline/ (checkpoints, resume state, baseline.json naming the algorithm),
reports/rl_baseline/learning_curve.csv and train_curve.csv. With `rl.baseline: null` it trains nothing:
baseline.json says so, the curves are empty, and evaluate leaves the baseline out.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from protege.config import Config
from protege.stages.common import StepHistory, say, write_stage_metrics
from protege.stages.rl import empty_curve, train, train_curve

RL_BASELINE = Path("models/rl_baseline")
CURVE = Path("reports/rl_baseline/learning_curve.csv")
MARKER = "baseline.json"


def baseline_algorithm(root: Path) -> str | None:
    """The algorithm the rl_baseline stage trained with, or None (not run, `rl.baseline: null`, no checkpoint)."""
    marker = root / RL_BASELINE / MARKER
    if not marker.exists() or not any((root / RL_BASELINE).glob("step-*")):
        return None
    return json.loads(marker.read_text()).get("algorithm")


def run(cfg: Config, root: Path, run) -> None:
    algorithm = cfg.rl.baseline
    out = root / RL_BASELINE
    if algorithm == cfg.rl.algorithm:  # the very run the rl stage trains: nothing to compare
        say("rl_baseline", f"rl.baseline is rl.algorithm ({algorithm}): no baseline run")
        algorithm = None
    if algorithm is None:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        (out / MARKER).write_text(json.dumps({"algorithm": None}) + "\n")
        empty_curve(root / CURVE)
        StepHistory(root / train_curve(CURVE))  # no step
        write_stage_metrics(root, "rl_baseline", {"checkpoints": 0})
        say("rl_baseline", "rl.baseline is null: no baseline run")
        return
    train(cfg, root, run, algorithm, RL_BASELINE, CURVE, "rl_baseline", f"{algorithm}-final")
    (out / MARKER).write_text(json.dumps({"algorithm": algorithm}) + "\n")
