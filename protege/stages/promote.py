"""promote: register the candidate in MLflow; move alias `champion` only when its benchmark average beats
the champion's by more than promote.margin points."""
from __future__ import annotations

import json
from pathlib import Path

from protege import tracking
from protege.config import Config
from protege.paths import EVAL_JSON, PROMOTION
from protege.stages.common import say


def decide(score: float, champion_score: float | None, margin: float) -> bool:
    return champion_score is None or score > champion_score + margin


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.promote.model_dump(), "promote.")
    report = json.loads((root / EVAL_JSON).read_text())
    candidate = report["models"][report["candidate"]]
    score = float(report["score"])
    model_id = run.log_model(root / candidate["path"], report["candidate"], params={"score": score})
    name = cfg.promote.model_name
    old_version, old_score = tracking.champion(root, name)
    promote = decide(score, old_score, cfg.promote.margin)
    version = tracking.register(root, model_id, name, score, make_champion=promote)
    result = {"model_name": name, "version": version, "score": score, "promoted": promote,
              "previous_champion_version": old_version, "previous_champion_score": old_score}
    (root / PROMOTION).write_text(json.dumps(result, indent=2))
    run.log_metrics({"score": score, "promoted": float(promote)})
    verdict = (f"is the new champion (was v{old_version} at {old_score:.2f})" if promote and old_version
               else "is the first champion" if promote
               else f"stays a challenger: champion v{old_version} scores {old_score:.2f}")
    say("promote", f"{name} v{version} (score {score:.2f}) {verdict}")
