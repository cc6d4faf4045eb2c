"""Scheduled retraining, the library half (the flow in flows/retrain.py only wires these steps):

1. `admit`: files in data/incoming/ are validated into the pool (protege.pool); bad ones go to data/rejected/.
2. `start_from_champion`: the registry's champion is exported to models/champion, versioned with
   `dvc add`, and `sft.init` points at it, so the stages that follow continue from it (dvc.yaml lists
   `${sft.init}` as sft's dependency, so DVC sees the change). Without a champion SFT starts from the base.
3. the pipeline's stages run through DVC (the flow's job); promote registers the candidate as
   `challenger` and moves `champion` only when its evaluation beats the champion's.
4. `record`: a manifest in data/archive/<run id>/retrain.json says what came in, what went out and
   what promote decided.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from protege.pool import ARCHIVE, POOL, Admission, admit_incoming

CHAMPION_DIR = Path("models/champion")


@dataclass
class Start:
    champion_version: str | None
    init: str            # what sft starts from in this run
    params_changed: bool


def admit(project_dir: Path, run_id: str) -> Admission:
    from protege.pipeline import dvc_add

    result = admit_incoming(project_dir, run_id)
    if result.accepted or not (Path(project_dir) / f"{POOL}.dvc").exists():
        dvc_add(project_dir, POOL)  # a new version of the pool: DVC hashes it, `dvc push` shares it
    return result


def start_from_champion(project_dir: Path, model_name: str) -> Start:
    from protege.pipeline import dvc_add, set_param
    from protege.tracking import export_model_version

    project_dir = Path(project_dir)
    version = export_model_version(project_dir, model_name, "champion", project_dir / CHAMPION_DIR)
    if version is None:
        from protege.config import load_config

        return Start(None, load_config(project_dir / "params.yaml").sft.init, False)
    dvc_add(project_dir, CHAMPION_DIR)
    changed = set_param(project_dir, "sft.init", CHAMPION_DIR.as_posix())
    return Start(version, CHAMPION_DIR.as_posix(), changed)


def record(project_dir: Path, run_id: str, admission: Admission, start: Start | None,
           promotion: dict | None) -> Path:
    from protege.files import write_atomic

    out = Path(project_dir) / ARCHIVE / run_id / "retrain.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"run_id": run_id, **admission.as_dict(), "start": asdict(start) if start else None,
           "promotion": promotion}
    write_atomic(out, lambda t: t.write_text(json.dumps(doc, indent=2)))
    return out
