"""The pipeline flow: every dvc.yaml stage in order, under one MLflow parent run."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# a local run uses Prefect's ephemeral API server, with its state kept inside the project
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# its first start in a new PREFECT_HOME creates the database; on 2 cores that can exceed the 20 s default
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_HOME", str(Path(".prefect").resolve()))

from prefect import flow  # noqa: E402

import protege  # noqa: E402,F401  (offline settings)
from protege.stages import STAGES  # noqa: E402
from tasks.stages import close_parent_run, open_parent_run, stage_task  # noqa: E402


@flow(name="protege-pipeline", log_prints=True)
def pipeline(project_dir: str = ".", stages: list[str] | None = None) -> dict[str, list[str]]:
    project_dir = str(Path(project_dir).resolve())
    parent = open_parent_run(project_dir, "pipeline")
    outputs: dict[str, list[str]] = {}
    try:
        for stage in stages or STAGES:
            outputs[stage] = stage_task(stage)(project_dir, stage, parent)
    except BaseException:
        close_parent_run(project_dir, parent, "FAILED")
        raise
    close_parent_run(project_dir, parent, "FINISHED")
    return outputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--project", default=".")
    ap.add_argument("--stages", nargs="*", default=None, help="subset of stages (default: all, in order)")
    args = ap.parse_args(argv)
    state = pipeline(args.project, args.stages, return_state=True)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main())
