"""The evaluate flow (deployment `evaluate`): any registered model version on the configured benchmarks,
e.g. model_uri models:/protege-student@champion or models:/protege-student/3. Reads the registry and
writes only under reports/registry-eval/, so it needs no workspace lock."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from prefect import flow  # noqa: E402

import protege  # noqa: E402,F401  (offline settings)
from tasks.retrain import evaluate_registered  # noqa: E402


@flow(name="protege-evaluate", log_prints=True)
def evaluate(model_uri: str = "models:/protege-student@champion", project_dir: str = ".",
             benchmarks: str = "all") -> str:
    return evaluate_registered(str(Path(project_dir).resolve()), model_uri, benchmarks)
