"""One pipeline stage as its own flow, so a deployment can place it on a work pool (prefect.yaml's
stage-cpu and stage-gpu). The pipeline and retrain flows call it through those deployments when they run
with dispatch 'pools'."""
from __future__ import annotations

from prefect import flow

import protege  # noqa: F401  (offline settings)
from protege.pipeline import repro_stage


@flow(name="protege-stage", log_prints=True, flow_run_name="{stage}")
def stage(project_dir: str, stage: str, parent_run_id: str | None = None) -> list[str]:
    return repro_stage(project_dir, stage, parent_run_id)
