"""Prefect tasks of retraining and registry evaluation: thin wrappers that take and return plain values."""
import json
from pathlib import Path

from prefect import task

from protege import retrain
from protege.config import load_config
from protege.paths import PROMOTION


@task(name="admit-incoming")
def admit(project_dir: str, run_id: str) -> dict:
    result = retrain.admit(Path(project_dir), run_id)
    for name, why in result.rejected.items():
        print(f"rejected {name}: {why.splitlines()[0]} (moved to data/rejected/{run_id}/)")
    print(f"{len(result.accepted)} file(s) added to the pool, {len(result.rejected)} rejected")
    return result.as_dict()


@task(name="start-from-champion")
def start_from_champion(project_dir: str) -> dict:
    cfg = load_config(Path(project_dir) / "params.yaml")
    start = retrain.start_from_champion(Path(project_dir), cfg.promote.model_name)
    print(f"sft starts from {start.init}" + (f" (champion v{start.champion_version})" if start.champion_version else ""))
    return start.__dict__


@task(name="record-retrain")
def record(project_dir: str, run_id: str, admission: dict, start: dict | None) -> dict:
    promo_path = Path(project_dir) / PROMOTION
    promotion = json.loads(promo_path.read_text()) if start is not None and promo_path.exists() else None
    adm = retrain.Admission(**admission)
    st = retrain.Start(**start) if start else None
    path = retrain.record(Path(project_dir), run_id, adm, st, promotion)
    print(f"retrain record: {path}")
    return {"record": str(path), "promotion": promotion}


@task(name="evaluate-registered")
def evaluate_registered(project_dir: str, model_uri: str, benchmarks: str) -> str:
    from protege.registry_eval import evaluate_model_version

    return str(evaluate_model_version(Path(project_dir), model_uri, benchmarks))
