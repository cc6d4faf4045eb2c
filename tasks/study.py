"""Prefect tasks of a study: thin wrappers around protege.study.runner that take and return plain values.
A run is (part, variant, seed); part is None for a study file without `parts:`."""
from prefect import task

from protege.study import services
from protege.study import warm_starts
from protege.study.runner import execute_isolated, finish_study, finish_suite, open_study, plan, run_key
from protege.study.spec import load_study, load_suite


@task(name="study-plan")
def pending_runs(study_file: str, project_dir: str) -> list[tuple[str | None, str, int]]:
    out = []
    for study in load_suite(study_file, project_dir).studies:
        planned = plan(study)
        for p in planned:
            if p.finished:
                print(f"{run_key(study, p.run)}: finished earlier, skipped")
            else:
                out.append((study.part, p.run.variant, p.run.seed))
        warm_starts.ensure(study, [p.run for p in planned if not p.finished])  # before any run links one
    return out


@task(name="study-open")
def open_study_runs(study_file: str, project_dir: str) -> dict[str | None, str]:
    return {s.part: open_study(s) for s in load_suite(study_file, project_dir).studies}


@task(name="study-services")
def start_services(study_file: str, project_dir: str, pending: list[tuple[str | None, str, int]]) -> list[int]:
    pids = []
    for study in load_suite(study_file, project_dir).studies:
        configs = [study.find_run(v, s).config for part, v, s in pending if part == study.part]
        pids += services.start(study, configs)
    return pids


@task(name="study-run", task_run_name="{part}:{variant}/seed-{seed}")
def study_run(study_file: str, project_dir: str, part: str | None, variant: str, seed: int,
              parent_run_id: str) -> str:
    study = load_study(study_file, project_dir, part)
    planned = next(p for p in plan(study) if (p.run.variant, p.run.seed) == (variant, seed))
    return str(execute_isolated(study, planned, parent_run_id))


@task(name="study-stop-services")
def stop_services(pids: list[int]) -> None:
    services.stop(pids)


@task(name="study-report")
def report(study_file: str, project_dir: str, parents: dict[str | None, str],
           failed: list[tuple[str | None, str, int]]) -> str:
    suite = load_suite(study_file, project_dir)
    path = None
    for study in suite.studies:
        keys = [f"{v}/seed-{s}" for part, v, s in failed if part == study.part]
        path = finish_study(study, parents[study.part], keys)["md"]
    if suite.has_parts:
        path = finish_suite(suite)["md"]
    return str(path)
