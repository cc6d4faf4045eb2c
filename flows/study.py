"""The study flow: one task per pending (part, variant, seed) run, under its study's MLflow parent run,
then the reports (and, for a file with parts, the claims table). `protege study FILE` runs it; a finished
run is not a task at all."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# a local run uses Prefect's ephemeral API server, with its state kept inside the project
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_HOME", str(Path(".prefect").resolve()))

from prefect import flow  # noqa: E402
from prefect.futures import wait  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

import protege  # noqa: E402,F401  (offline settings)
from tasks.study import open_study_runs, pending_runs, report, start_services, stop_services, study_run  # noqa: E402


@flow(name="protege-study", log_prints=True)
def study(study_file: str, project_dir: str = ".") -> str:
    pending = pending_runs(study_file, project_dir)
    parents = open_study_runs(study_file, project_dir)
    pids = start_services(study_file, project_dir, pending)
    try:
        futures = [study_run.submit(study_file, project_dir, part, variant, seed, parents[part])
                   for part, variant, seed in pending]
        wait(futures)
    finally:
        stop_services(pids)
    failed = [run for run, f in zip(pending, futures) if not f.state.is_completed()]
    path = report(study_file, project_dir, parents, failed)
    if failed:
        names = ", ".join(f"{p}:{v}/seed-{s}" if p else f"{v}/seed-{s}" for p, v, s in failed)
        raise RuntimeError(f"{len(failed)} run(s) failed: {names}; re-run the study to retry them "
                           f"(finished runs are kept); report of the rest: {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--study", required=True, help="study file")
    ap.add_argument("--project", default=".")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each in its own process)")
    args = ap.parse_args(argv)
    runner = ThreadPoolTaskRunner(max_workers=max(1, args.jobs))
    state = study.with_options(task_runner=runner)(str(Path(args.study).resolve()),
                                                   str(Path(args.project).resolve()), return_state=True)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main())
