"""MLflow helpers: the only module that talks to MLflow.

MLflow's active run is thread-local and each stage is its own process, so the pipeline's parent run id
travels in the environment (PROTEGE_PARENT_RUN_ID) and every stage opens its own nested run.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

PARENT_ENV = "PROTEGE_PARENT_RUN_ID"
EXPERIMENT_ENV = "PROTEGE_EXPERIMENT"
DEFAULT_EXPERIMENT = "protege"


def tracking_uri(project_dir: Path) -> str:
    # A sqlite store at an absolute path: the ./mlruns file store refuses to start since MLflow 3.13
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(project_dir).resolve() / 'mlflow.db'}"


def _mlflow(project_dir: Path):
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(tracking_uri(project_dir))
    name = os.environ.get(EXPERIMENT_ENV, DEFAULT_EXPERIMENT)
    if mlflow.get_experiment_by_name(name) is None:
        # artifacts beside the store, not in ./mlruns of whatever folder the process started in
        location = (Path(project_dir).resolve() / "mlartifacts").as_uri()
        try:
            mlflow.create_experiment(name, artifact_location=location)
        except MlflowException:
            pass  # another stage created it first
    mlflow.set_experiment(name)
    return mlflow


def dvc_digest(project_dir: Path, path: str | Path) -> str | None:
    """The md5 DVC recorded for `path` as some stage's output, if any (None before the first lock)."""
    lock = Path(project_dir) / "dvc.lock"
    if not lock.exists():
        return None
    rel = str(Path(path))
    for stage in (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).values():
        for out in stage.get("outs", []):
            if out.get("path") == rel:
                return out.get("md5")
    return None


def stat_digest(path: Path) -> str:
    """Cheap identity of a file or folder without a DVC lock entry: names, sizes and mtimes."""
    if not path.exists():
        return "absent"
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path) if path.is_dir() else f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _content_digest(path: Path) -> str:
    h = hashlib.md5()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


class StageRun:
    def __init__(self, mlflow, run, project_dir: Path):
        self.mlflow, self.run, self.project_dir = mlflow, run, Path(project_dir)

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def log_params(self, params: dict[str, Any], prefix: str = "") -> None:
        flat = _flatten(params, prefix)
        self.mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_input(self, path: str | Path, context: str) -> None:
        """Logs a dataset or checkpoint this stage reads, with DVC's hash as its digest."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        path = Path(path)
        digest = dvc_digest(self.project_dir, path) or _content_digest(self.project_dir / path)
        with warnings.catch_warnings():  # MLflow registers the local source twice and warns about it
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(str((self.project_dir / path).resolve()))
        ds = MetaDataset(source, name=str(path),
                         digest=digest[:36])
        self.mlflow.log_input(ds, context=context)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        p = Path(path)
        if p.is_dir():
            self.mlflow.log_artifacts(str(p), artifact_path)
        else:
            self.mlflow.log_artifact(str(p), artifact_path)

    def log_model(self, checkpoint_dir: str | Path, name: str, params: dict | None = None) -> str:
        """Logs a checkpoint folder (safetensors + configs) as an MLflow LoggedModel; returns its id."""
        from mlflow import MlflowClient

        model = self.mlflow.initialize_logged_model(name=name, source_run_id=self.run_id,
                                                    params={k: str(v) for k, v in (params or {}).items()},
                                                    model_type="protege-checkpoint")
        MlflowClient().log_model_artifacts(model.model_id, str(checkpoint_dir))
        self.mlflow.finalize_logged_model(model.model_id, "READY")
        self.mlflow.set_tag(f"model_id.{name}", model.model_id)
        return model.model_id


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


@contextmanager
def stage_run(stage: str, project_dir: Path) -> Iterator[StageRun]:
    """A nested run under the pipeline's parent run, or a top-level run when a stage runs alone."""
    mlflow = _mlflow(project_dir)
    parent = os.environ.get(PARENT_ENV) or None
    with mlflow.start_run(run_name=stage, parent_run_id=parent, tags={"protege.stage": stage}) as run:
        yield StageRun(mlflow, run, project_dir)


def start_parent_run(project_dir: Path, name: str, tags: dict[str, str] | None = None) -> str:
    mlflow = _mlflow(project_dir)
    run = mlflow.start_run(run_name=name, tags={"protege.pipeline": "true", **(tags or {})})
    mlflow.end_run()
    return run.info.run_id


def end_parent_run(project_dir: Path, run_id: str, status: str, metrics: dict[str, float] | None = None) -> None:
    _mlflow(project_dir)
    from mlflow import MlflowClient

    client = MlflowClient()
    for k, v in (metrics or {}).items():
        client.log_metric(run_id, k, float(v))
    client.set_terminated(run_id, status=status)


def champion(project_dir: Path, model_name: str) -> tuple[str | None, float | None, str | None]:
    """(version, score, what the score was measured on) of the version holding alias 'champion'."""
    _mlflow(project_dir)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        mv = MlflowClient().get_model_version_by_alias(model_name, "champion")
    except MlflowException:
        return None, None, None
    score = mv.tags.get("protege.score")
    return mv.version, (float(score) if score is not None else None), mv.tags.get("protege.scored_on")


def register(project_dir: Path, model_id: str, model_name: str, score: float, make_champion: bool,
             scored_on: str = "") -> str:
    mlflow = _mlflow(project_dir)
    from mlflow import MlflowClient

    mv = mlflow.register_model(f"models:/{model_id}", model_name,
                               tags={"protege.score": f"{score:.6f}", "protege.scored_on": scored_on})
    if make_champion:
        MlflowClient().set_registered_model_alias(model_name, "champion", mv.version)
    return mv.version


def download_artifacts(project_dir: Path, run_id: str, artifact_path: str, dst: Path) -> Path:
    """A run's artifact folder, copied locally; a clear error for an unknown run or a run without it."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per file floods the terminal
    mlflow = _mlflow(project_dir)
    from mlflow.exceptions import MlflowException

    from protege.errors import UserFacingError

    try:
        mlflow.get_run(run_id)
    except MlflowException:
        raise UserFacingError(f"MLflow run {run_id} not found in {tracking_uri(project_dir)}") from None
    try:
        return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                        dst_path=str(dst)))
    except (MlflowException, OSError):
        raise UserFacingError(f"MLflow run {run_id} has no '{artifact_path}' artifacts (is it an evaluate or "
                              "`protege eval run` run?)") from None


# --- studies (`protege study`): one parent run per study, one nested run per (variant, seed) ------------------

STUDY_TAG = "protege.study"


def _experiment_id(mlflow) -> str:
    return mlflow.get_experiment_by_name(os.environ.get(EXPERIMENT_ENV, DEFAULT_EXPERIMENT)).experiment_id


def _live_run(client, run_id: str | None):
    """The run if it exists and is not deleted, else None."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage == "active" else None


def open_study_run(project_dir: Path, name: str, params: dict[str, Any], run_id: str | None = None) -> str:
    """The study's parent run `study:<name>`: the run `run_id` reopened (a study re-run after a kill keeps
    one parent), or a new one."""
    mlflow = _mlflow(project_dir)
    from mlflow import MlflowClient

    client = MlflowClient()
    if _live_run(client, run_id) is not None:
        client.update_run(run_id, status="RUNNING")
        return run_id
    run = client.create_run(_experiment_id(mlflow), run_name=f"study:{name}",
                            tags={STUDY_TAG: name, "protege.study.parent": "true"})
    for k, v in _flatten(params).items():
        client.log_param(run.info.run_id, k, str(v)[:500])
    return run.info.run_id


class _ResultsOnlyRun(StageRun):
    """A study run that keeps result files only: checkpoints are not copied into the MLflow store."""

    def log_model(self, checkpoint_dir: str | Path, name: str, params: dict | None = None) -> str:
        self.mlflow.set_tag(f"model_not_logged.{name}", "the study keeps result files only (keep_checkpoints: false)")
        return ""


@contextmanager
def study_child_run(project_dir: Path, parent_run_id: str | None, name: str, tags: dict[str, str],
                    run_id: str | None = None, log_models: bool = True, root: Path | None = None
                    ) -> Iterator[StageRun]:
    """A (variant, seed) run nested under the study's parent, in the project's store; `run_id` (an unfinished
    earlier attempt of the same run) is resumed rather than duplicated. Inputs are read relative to `root`
    (the run's folder). A run that raises ends FAILED."""
    mlflow = _mlflow(project_dir)
    from mlflow import MlflowClient

    resume = _live_run(MlflowClient(), run_id)
    if resume is not None:
        active = mlflow.start_run(run_id=run_id, tags=tags)
    else:
        active = mlflow.start_run(run_name=name, parent_run_id=parent_run_id, tags=tags)
    with active as run:
        yield (StageRun if log_models else _ResultsOnlyRun)(mlflow, run, root or project_dir)


def retire_run(project_dir: Path, run_id: str | None, why: str) -> None:
    """Marks an earlier attempt of a study run as superseded (and KILLED if it never ended)."""
    _mlflow(project_dir)
    from mlflow import MlflowClient

    client = MlflowClient()
    run = _live_run(client, run_id)
    if run is None:
        return
    client.set_tag(run_id, "protege.superseded", why)
    if run.info.status == "RUNNING":
        client.set_terminated(run_id, status="KILLED")


def close_study_run(project_dir: Path, run_id: str, status: str, metrics: dict[str, float] | None = None,
                    tags: dict[str, str] | None = None, artifacts: list[Path] | None = None) -> None:
    """Ends the study's parent run with its headline figures, verdict tags and report files."""
    _mlflow(project_dir)
    from mlflow import MlflowClient

    client = MlflowClient()
    for k, v in (metrics or {}).items():
        client.log_metric(run_id, k, float(v))
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, str(v)[:5000])
    for path in artifacts or []:
        if Path(path).exists():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status=status)

