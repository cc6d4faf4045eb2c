"""promote: register the candidate in MLflow with its lineage (protege/lineage.py); the new version takes alias
`challenger`, and `champion` moves to it only when its benchmark average beats the champion's by more than
promote.margin points."""
from __future__ import annotations

import json
from pathlib import Path

from protege import lineage, tracking
from protege.config import Config, tracked_params
from protege.paths import EVAL_JSON, PROMOTION
from protege.stages.common import say


def decide(score: float, champion_score: float | None, margin: float, same_suite: bool = True,
           has_champion: bool | None = None) -> bool:
    """The first model becomes champion. Otherwise the average must beat the champion's by more than
    `margin`; a champion without a recorded score, or scored on another suite or protocol, stays (the
    averages are not comparable; move the alias by hand if you mean to)."""
    has_champion = champion_score is not None if has_champion is None else has_champion
    if not has_champion:
        return True
    return champion_score is not None and same_suite and score > champion_score + margin


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(tracked_params(cfg.promote), "promote.")
    report = json.loads((root / EVAL_JSON).read_text())
    candidate = report["models"][report["candidate"]]
    score = float(report["score"])
    name = cfg.promote.model_name
    # before the checkpoint is uploaded: a pipeline without dvc.lock fails here, cheaply
    record, tags = lineage.record_and_tags(root, run, name, report["candidate"], candidate["path"])
    for warning in record["warnings"]:
        say("promote", f"[yellow]warning[/]: {warning}")
    model_id = run.log_model(root / candidate["path"], report["candidate"], params={"score": score})
    old_version, old_score, old_on = tracking.champion(root, name)
    scored_on = f"{report['suite']}|{report['protocol']}"
    same = old_on == scored_on
    promote = decide(score, old_score, cfg.promote.margin, same, has_champion=old_version is not None)
    version = tracking.register(root, model_id, name, score, make_champion=promote, scored_on=scored_on,
                                 tags=tags)
    result = {"model_name": name, "version": version, "score": score, "scored_on": scored_on, "promoted": promote,
              "previous_champion_version": old_version, "previous_champion_score": old_score,
              "previous_champion_scored_on": old_on,
              "lineage": tags[lineage.TAG + "record"]}
    (root / PROMOTION).write_text(json.dumps(result, indent=2))
    run.log_metrics({"score": score, "promoted": float(promote)})
    if old_version is None:
        verdict = "is the first champion"
    elif old_score is None or not same:
        verdict = (f"stays a challenger: champion v{old_version} was scored on {old_on or 'an unrecorded suite'}"
                   f"{'' if old_score is None else f' ({old_score:.2f})'}, not on {scored_on}; averages over "
                   "different suites are not compared (move the alias by hand to switch)")
    elif promote:
        verdict = f"is the new champion (was v{old_version} at {old_score:.2f})"
    else:
        verdict = f"stays a challenger: champion v{old_version} scores {old_score:.2f} (margin {cfg.promote.margin})"
    say("promote", f"{name} v{version} (average {score:.2f} on {scored_on}) {verdict}")
