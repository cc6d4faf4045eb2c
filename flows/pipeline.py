"""The pipeline flow: every dvc.yaml stage in order, under one MLflow parent run.

dispatch 'inline' (the CLI's `protege pipeline`) runs each stage in this flow's process; 'pools' (the
deployments in prefect.yaml) runs each one as a flow run of protege-stage/stage-<pool>, on the work pool
that params.yaml's orchestration section names for it. Inline, `orchestration.jobs` stages of independent
branches run at once (protege/pipeline.py says how DVC still records each). Either way the flow holds the
project's workspace lock: one writer per DVC workspace."""
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
from protege import stage_host  # noqa: E402
from protege.config import load_config  # noqa: E402
from protege.pipeline import expected_seconds, run_dag, stage_upstream  # noqa: E402
from protege.workspace import workspace_lock  # noqa: E402
from tasks.stages import (  # noqa: E402
    close_parent_run,
    dispatch_stage,
    open_parent_run,
    parallel_stage_task,
    stage_pool,
    stage_task,
    version_pool,
    write_dag,
)


def run_stages(project_dir: str, stages, parent: str, dispatch: str) -> dict[str, list[str]]:
    outputs: dict[str, list[str]] = {}
    if dispatch == "pools":
        for stage in stages:
            outputs[stage] = dispatch_stage(project_dir, stage, parent, stage_pool(project_dir, stage))
        return outputs
    jobs = load_config(f"{project_dir}/params.yaml").orchestration.jobs
    with stage_host.running():  # the stage commands DVC runs skip the imports a fresh process pays for
        if jobs == 1:
            for stage in stages:
                outputs[stage] = stage_task(stage)(project_dir, stage, parent)
            return outputs
        # every stage starts once the stages writing its deps are done, at most `jobs` at a time
        return run_dag(stage_upstream(project_dir, stages),
                       lambda stage: parallel_stage_task(stage)(project_dir, stage, parent), jobs,
                       expected_seconds(project_dir))


@flow(name="protege-pipeline", log_prints=True)
def pipeline(project_dir: str = ".", stages: list[str] | None = None, dispatch: str = "inline",
             wait_for_workspace_s: float = 0.0) -> dict[str, list[str]]:
    if dispatch not in ("inline", "pools"):
        raise ValueError(f"dispatch {dispatch!r}: expected 'inline' or 'pools'")
    project_dir = str(Path(project_dir).resolve())
    with workspace_lock(project_dir, "pipeline", wait_for_workspace_s,
                        on_wait=lambda who: print(f"waiting for {who} to finish")):
        in_dag = write_dag(project_dir)
        version_pool(project_dir)
        parent = open_parent_run(project_dir, "pipeline")
        try:
            outputs = run_stages(project_dir, stages or in_dag, parent, dispatch)
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
