"""One task per pipeline stage run: DVC decides whether the stage has work to do."""
from prefect import task

from protege.pipeline import headline_metrics, repro_stage
from protege.tracking import end_parent_run, start_parent_run

IO_STAGES = {"world", "teachers", "promote"}  # they touch files or services that can fail transiently


@task(name="stage", task_run_name="{stage}")
def run_stage(project_dir: str, stage: str, parent_run_id: str) -> list[str]:
    return repro_stage(project_dir, stage, parent_run_id)


def stage_task(stage: str):
    return run_stage.with_options(retries=2 if stage in IO_STAGES else 0, retry_delay_seconds=2)


@task(name="open-mlflow-run")
def open_parent_run(project_dir: str, name: str) -> str:
    return start_parent_run(project_dir, name)


@task(name="close-mlflow-run")
def close_parent_run(project_dir: str, run_id: str, status: str) -> None:
    end_parent_run(project_dir, run_id, status, headline_metrics(project_dir))
