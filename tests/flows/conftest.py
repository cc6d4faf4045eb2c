"""One finished tiny project for the end-to-end tests: the pipeline flow runs once per session, the pipeline
test checks what it made, then the service test retrains from its champion (the pipeline's MLflow store holds
absolute artifact paths, so the project is shared, not copied)."""
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

SERVICE_FILES = ("flows", "tasks", "prefect.yaml")


@dataclass
class FinishedProject:
    path: Path
    flow: subprocess.CompletedProcess  # the first pipeline run's output


@pytest.fixture(scope="session")
def finished_project(tmp_path_factory) -> FinishedProject:
    from tests.flows.test_pipeline import make_project, run_flow

    proj = make_project(tmp_path_factory.mktemp("finished"))
    for name in SERVICE_FILES:  # what `make serve` needs beside the DAG
        src = REPO / name
        (shutil.copytree(src, proj / name, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else shutil.copy(src, proj / name))
    return FinishedProject(proj, run_flow(proj))
