"""The retrain flow (deployment `retrain`, nightly by default): files dropped in data/incoming/ are
validated into the DVC-versioned pool, the stages re-run through DVC starting from the registry's
champion, and promote registers the candidate as `challenger`, moving `champion` only when the
evaluation beats it. Nothing new in the inbox: nothing trains. Holds the workspace lock throughout."""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect import flow  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

import protege  # noqa: E402,F401  (offline settings)
from flows.pipeline import run_stages  # noqa: E402
from protege.workspace import workspace_lock  # noqa: E402
from tasks.retrain import admit, record, start_from_champion  # noqa: E402
from tasks.stages import close_parent_run, open_parent_run, write_dag  # noqa: E402


@flow(name="protege-retrain", log_prints=True)
def retrain(project_dir: str = ".", dispatch: str = "inline", wait_for_workspace_s: float = 3600.0) -> dict:
    project_dir = str(Path(project_dir).resolve())
    run_id = flow_run.get_id() or "local"
    with workspace_lock(project_dir, f"retrain {run_id}", wait_for_workspace_s,
                        on_wait=lambda who: print(f"waiting for {who} to finish")):
        admission = admit(project_dir, run_id)
        if not admission["accepted"]:
            print("no new data in data/incoming/: nothing to train")
            return record(project_dir, run_id, admission, None)
        start = start_from_champion(project_dir)
        stages = write_dag(project_dir)  # sft.init now names the champion: with your files, a dependency again
        parent = open_parent_run(project_dir, "retrain")
        try:
            run_stages(project_dir, stages, parent, dispatch)
        except BaseException:
            close_parent_run(project_dir, parent, "FAILED")
            raise
        close_parent_run(project_dir, parent, "FINISHED")
        return record(project_dir, run_id, admission, start)
