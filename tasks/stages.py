"""One task per pipeline stage run: DVC decides whether the stage has work to do."""
from prefect import task
from prefect.deployments import run_deployment

from protege.config import load_config
from protege.pipeline import headline_metrics, repro_stage, run_stage_beside_others, stage_changed, stage_outs
from protege.tracking import end_parent_run, start_parent_run

IO_STAGES = {"world", "teachers", "promote"}  # they touch files or services that can fail transiently
STAGE_FLOW = "protege-stage"


@task(name="stage", task_run_name="{stage}")
def run_stage(project_dir: str, stage: str, parent_run_id: str) -> list[str]:
    return repro_stage(project_dir, stage, parent_run_id)


def stage_task(stage: str):
    return run_stage.with_options(retries=2 if stage in IO_STAGES else 0, retry_delay_seconds=2)


@task(name="stage", task_run_name="{stage}")
def run_stage_beside(project_dir: str, stage: str, parent_run_id: str) -> list[str]:
    return run_stage_beside_others(project_dir, stage, parent_run_id)


def parallel_stage_task(stage: str):
    return run_stage_beside.with_options(retries=2 if stage in IO_STAGES else 0, retry_delay_seconds=2)


@task(name="stage-on-pool", task_run_name="{stage}@{pool}")
def dispatch_stage(project_dir: str, stage: str, parent_run_id: str, pool: str) -> list[str]:
    """The stage as a flow run of deployment protege-stage/stage-<pool>, i.e. on that pool's workers; a stage
    DVC would skip is not dispatched (a pool's worker may be a GPU job that takes minutes to start)."""
    if not stage_changed(project_dir, stage):
        print(f"Stage '{stage}' didn't change, not dispatched", flush=True)
        return stage_outs(project_dir, stage)
    run = run_deployment(f"{STAGE_FLOW}/stage-{pool}", timeout=None, as_subflow=True, poll_interval=1,
                         parameters={"project_dir": project_dir, "stage": stage, "parent_run_id": parent_run_id})
    if not run.state.is_completed():
        raise RuntimeError(f"stage '{stage}' on pool '{pool}' ended {run.state.name}: {run.state.message or ''}")
    return stage_outs(project_dir, stage)  # a flow run's return value needs persisted results; the paths do not


def stage_pool(project_dir: str, stage: str) -> str:
    return load_config(f"{project_dir}/params.yaml").orchestration.pool_of(stage)


@task(name="write-dag")
def write_dag(project_dir: str) -> list[str]:
    """dvc.yaml for the project's params (its data source decides the first stages); the stages it holds."""
    from protege import dag

    if dag.write(load_config(f"{project_dir}/params.yaml"), project_dir):
        print(f"{project_dir}/dvc.yaml: written for data.source {load_config(f'{project_dir}/params.yaml').data.source}")
    return dag.stages_in(project_dir)


@task(name="version-pool")
def version_pool(project_dir: str) -> None:
    """The retraining pool exists and DVC versions it (sft depends on it), even while it is empty."""
    from pathlib import Path

    from protege.pipeline import dvc_add
    from protege.pool import POOL, ensure_pool

    ensure_pool(Path(project_dir))
    if not (Path(project_dir) / f"{POOL}.dvc").exists():
        dvc_add(project_dir, POOL)


@task(name="open-mlflow-run")
def open_parent_run(project_dir: str, name: str) -> str:
    return start_parent_run(project_dir, name)


@task(name="close-mlflow-run")
def close_parent_run(project_dir: str, run_id: str, status: str) -> None:
    m = end_parent_run(project_dir, run_id, status, headline_metrics(project_dir))
    if "orchestration.ratio" in m:
        print(f"wall {m['orchestration.wall_s']:.1f} s = stage runs {m['orchestration.stage_runs_s']:.1f} s + stage "
              f"process start-up {m['orchestration.stage_startup_s']:.1f} s + DVC/Prefect/MLflow "
              f"{m['orchestration.other_s']:.1f} s (ratio {m['orchestration.ratio']:.2f})")
