"""Prefect tasks of a study: thin wrappers around protege.study.runner that take and return plain values."""
from prefect import task

from protege.study import services
from protege.study.runner import execute_isolated, finish_study, open_study, plan
from protege.study.spec import load_study


@task(name="study-plan")
def pending_runs(study_file: str, project_dir: str) -> list[tuple[str, int]]:
    planned = plan(load_study(study_file, project_dir))
    for p in planned:
        if p.finished:
            print(f"{p.run.key}: finished earlier, skipped")
    return [(p.run.variant, p.run.seed) for p in planned if not p.finished]


@task(name="study-open")
def open_study_run(study_file: str, project_dir: str) -> str:
    return open_study(load_study(study_file, project_dir))


@task(name="study-services")
def start_services(study_file: str, project_dir: str, pending: list[tuple[str, int]]) -> list[int]:
    study = load_study(study_file, project_dir)
    return services.start(study, [study.find_run(v, s).config for v, s in pending])


@task(name="study-run", task_run_name="{variant}/seed-{seed}")
def study_run(study_file: str, project_dir: str, variant: str, seed: int, parent_run_id: str) -> str:
    study = load_study(study_file, project_dir)
    planned = next(p for p in plan(study) if (p.run.variant, p.run.seed) == (variant, seed))
    return str(execute_isolated(study, planned, parent_run_id))


@task(name="study-stop-services")
def stop_services(pids: list[int]) -> None:
    services.stop(pids)


@task(name="study-report")
def report(study_file: str, project_dir: str, parent_run_id: str, failed: list[str]) -> str:
    return str(finish_study(load_study(study_file, project_dir), parent_run_id, failed)["md"])
