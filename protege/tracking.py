"""MLflow helpers: the only module that talks to MLflow.

MLflow's active run is thread-local and each stage is its own process, so the pipeline's parent run id
travels in the environment (PROTEGE_PARENT_RUN_ID) and every stage opens its own nested run. A stage run
also samples system metrics, and copies its params and metrics to the loggers `tracking.loggers` adds
(wandb, TensorBoard); MLflow stays the record of lineage.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from protege.dvc_lockfile import parse_dvc_file, read_dvc_lock, read_dvc_yaml
from protege.files import file_md5

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
        # artifacts beside a local store, not in ./mlruns of whatever folder the process started in; a
        # tracking server keeps its own artifact store (object storage on a cluster)
        local = not tracking_uri(project_dir).startswith(("http://", "https://", "databricks"))
        location = (Path(project_dir).resolve() / "mlartifacts").as_uri() if local else None
        try:
            mlflow.create_experiment(name, artifact_location=location)
        except MlflowException:
            pass  # another stage created it first
    mlflow.set_experiment(name)
    return mlflow


def _lock_outs(project_dir: Path) -> list[dict]:
    """Every stage output dvc.lock records (none before the first lock)."""
    text = read_dvc_lock(project_dir)
    stages = (parse_dvc_file(text) or {}).get("stages", {}) if text is not None else {}
    return [out for stage in stages.values() for out in stage.get("outs", [])]


def dvc_digest(project_dir: Path, path: str | Path, outs: list[dict] | None = None) -> str | None:
    """The md5 DVC recorded for `path` as some stage's output, if any (None before the first lock)."""
    rel = str(Path(path))
    return next((out.get("md5") for out in (_lock_outs(project_dir) if outs is None else outs)
                 if out.get("path") == rel), None)


def input_digest(project_dir: Path, path: str | Path) -> str:
    """Identity of a file or folder a run starts from, by content only: DVC's md5 when the lock records
    `path` itself, else the per-file md5 in the manifest of the DVC folder output that holds it, else the
    md5 of its bytes. Never mtimes or absolute paths: a copy, a checkout, `dvc pull` or `dvc exp run --temp`
    changes those, and a run that resumes must recognise its inputs there too."""
    root = Path(project_dir)
    outs = _lock_outs(root)  # read and parsed once
    found = dvc_digest(root, path, outs) or _manifest_md5(root, Path(path), outs)
    if found:
        return found
    return content_md5(root / path) if (root / path).exists() else "absent"


def _manifest_md5(root: Path, path: Path, outs: list[dict]) -> str | None:
    """The md5 DVC's directory manifest records for a file inside a folder output (None when the lock has
    no such folder, or its manifest is not in this project's cache, as before a `dvc pull`)."""
    rel = path.as_posix()
    for out in outs:
        folder, md5 = out.get("path", ""), out.get("md5", "")
        if not (md5.endswith(".dir") and rel.startswith(folder.rstrip("/") + "/")):
            continue
        manifest = _dvc_cache(root) / "files" / "md5" / md5[:2] / md5[2:]
        if not manifest.is_file():
            return None
        inner = rel[len(folder.rstrip("/")) + 1:]
        for entry in json.loads(manifest.read_text()):
            if entry.get("relpath") == inner:
                return entry.get("md5")
        return None
    return None


def _dvc_cache(root: Path) -> Path:
    """The project's DVC cache folder: `dir` under `[cache]` in .dvc/config (relative to .dvc/), or
    .dvc/cache."""
    config, section = root / ".dvc" / "config", None
    for line in (config.read_text().splitlines() if config.exists() else []):
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]").strip().strip("'\"")
        elif section == "cache" and line.split("=")[0].strip() == "dir" and "=" in line:
            return (root / ".dvc" / line.split("=", 1)[1].strip()).resolve()
    return root / ".dvc" / "cache"


def content_md5(path: Path) -> str:
    """md5 of a file's bytes (what DVC 3 records for a file); for a folder, of its files' relative paths
    and bytes in sorted order."""
    path = Path(path)
    if path.is_file():
        return file_md5(path)
    h = hashlib.md5()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + file_md5(f).encode() + b"\0")
    return h.hexdigest()



class StageRun:
    """The stage's MLflow run; params, metrics and tags also go to the other loggers `tracking.loggers` names."""

    def __init__(self, mlflow, run, project_dir: Path, loggers: list | None = None):
        self.mlflow, self.run, self.project_dir = mlflow, run, Path(project_dir)
        self.loggers = list(loggers or [])

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def log_params(self, params: dict[str, Any], prefix: str = "") -> None:
        flat = _flatten(params, prefix)
        self.mlflow.log_params({k: str(v)[:500] for k, v in flat.items()})
        self._fan_out("log_params", flat)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        self.mlflow.log_metrics(values, step=step)
        self._fan_out("log_metrics", values, step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags(tags)
        self._fan_out("set_tags", {k: str(v) for k, v in tags.items()})

    def _fan_out(self, method: str, *args) -> None:
        """A dashboard that stops accepting (a full disk, a dropped wandb service) is dropped with a warning:
        MLflow holds the record, and the stage's work must not be lost to a second copy of its figures."""
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args)
            except Exception as exc:  # noqa: BLE001 - any failure of an optional logger
                self.loggers.remove(logger)
                print(f"warning: {logger.name}: stopped logging this run ({type(exc).__name__}: {exc}); "
                      "MLflow still records it", file=sys.stderr)

    def log_input(self, path: str | Path, context: str) -> None:
        """Logs a dataset or checkpoint this stage reads, with DVC's hash as its digest."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        path = Path(path)
        digest = input_digest(self.project_dir, path)
        with warnings.catch_warnings():  # MLflow registers the local source twice and warns about it
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(str((self.project_dir / path).resolve()))
        ds = MetaDataset(source, name=str(path),
                         digest=digest[:36])
        try:
            self.mlflow.log_input(ds, context=context)
        except self.mlflow.exceptions.MlflowException as exc:
            # stages running side by side log the same dataset: MLflow looks it up, finds none, and both insert
            # it; the loser of that race finds the winner's row when it asks again
            if "UNIQUE constraint failed" not in str(exc):
                raise
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


class QuietRun:
    """Stands in for the stage's MLflow run on the ranks other than 0 of a multi-process stage: one process
    records the stage; the figures it logs are the global batch's, the same on every rank."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list) else v
    return out


# --- system metrics and the loggers beside MLflow (tracking.loggers) ----------------------------------------------

# One sample every 15 s, two averaged into each logged point: a point every 30 s is 120 an hour per metric,
# fine-grained enough to see a stall or a memory climb in a stage of hours without filling the store.
# MLflow's own variables (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL, ..._SAMPLES_BEFORE_LOGGING) win when set.
SYSTEM_METRICS_INTERVAL_S = 15.0
SYSTEM_METRICS_SAMPLES = 2
LOG_DIR = "logs"  # under the project: logs/tensorboard/<stage>/<run id>, logs/wandb
EXTRAS = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}  # logger: (module, extra)


def system_metrics_on() -> bool:
    """On unless MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING says false; sets protege's sampling defaults."""
    import logging

    from mlflow.environment_variables import (MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING,
                                              MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING,
                                              MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL)

    if MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.defined and not MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING.get():
        return False
    if not MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.defined:
        MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.set(SYSTEM_METRICS_INTERVAL_S)
    if not MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING.defined:
        MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING.set(SYSTEM_METRICS_SAMPLES)
    # its start/stop and "no GPU monitor" notes would print at INFO in every stage's output
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    return True


def tracking_settings(project_dir: Path):
    """The `tracking` section of the project's params.yaml (its defaults where there is none)."""
    from pydantic import ValidationError

    from protege.config import ConfigError, TrackingConfig, read_params

    path = Path(project_dir) / "params.yaml"
    if not path.is_file():
        return TrackingConfig()
    section = read_params(path)[0].get("tracking") or {}
    try:
        return TrackingConfig.model_validate(section)
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"{path}: tracking.{'.'.join(map(str, first['loc']))}: "
                          f"{first['msg'].removeprefix('Value error, ')}") from None


def check_loggers(names: list[str]) -> None:
    """Each logger's package is installed; else one line naming the extra that brings it."""
    import importlib.util

    from protege.errors import UserFacingError

    for name in names:
        if name in EXTRAS and importlib.util.find_spec(EXTRAS[name][0]) is None:
            module, extra = EXTRAS[name]
            raise UserFacingError(f"tracking.loggers lists {name}, but the {module} package is not installed: "
                                  f"pip install -e '.[{extra}]' (or take {name} out of tracking.loggers)")


def open_loggers(names: list[str], project_dir: Path, stage: str, run_id: str, parent: str | None) -> list:
    """The loggers other than MLflow, each holding one run for this stage run (named after the stage, keyed
    by the MLflow run id so the two can be matched)."""
    opened: list = []
    try:
        for name in names:
            if name == "tensorboard":
                opened.append(TensorBoardLogger(Path(project_dir) / LOG_DIR / "tensorboard" / stage / run_id))
            elif name == "wandb":
                opened.append(WandbLogger(Path(project_dir) / LOG_DIR, stage, run_id, parent))
    except BaseException:
        for logger in opened:
            logger.close(True)
        raise
    return opened


def _scalar(value: Any) -> bool | int | float | str | None:
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value, default=str)


class TensorBoardLogger:
    """Metrics as scalars; params as the run's hparams (TensorBoard's HPARAMS tab, beside the last value
    of each metric) and as a text table, written when the run closes, once all are known."""
    name = "tensorboard"

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.params: dict[str, Any] = {}
        self.tags: dict[str, str] = {}
        self.last: dict[str, float] = {}

    def log_params(self, params: dict[str, Any]) -> None:
        self.params.update(params)

    def log_metrics(self, metrics: dict[str, float], step: int | None) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
            self.last[key] = value

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)

    def close(self, failed: bool) -> None:
        from torch.utils.tensorboard.summary import hparams

        try:
            if self.params:
                # the metric names point the HPARAMS tab at the scalars already written (no second copy)
                for summary in hparams({k: "null" if v is None else _scalar(v) for k, v in self.params.items()},
                                       {k: 0.0 for k in self.last}):
                    self.writer.file_writer.add_summary(summary)
                self.writer.add_text("params", _markdown_table(self.params))
            if self.tags or failed:
                self.writer.add_text("tags", _markdown_table({**self.tags, **({"status": "FAILED"} if failed else {})}))
        finally:
            self.writer.close()


def _markdown_table(values: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {str(v).replace('|', '/')} |" for k, v in sorted(values.items()))
    return "| setting | value |\n|---|---|\n" + rows


def wandb_mode() -> str:
    """WANDB_MODE when set; else online only with an API key in the environment: a machine without one
    (CI, a cluster node) keeps the run on disk for `wandb sync` instead of failing the stage."""
    return os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


class WandbLogger:
    """One wandb run per stage run: named after the stage, its id the MLflow run id, grouped by the pipeline's
    parent run. Steps go to a `step` metric rather than wandb's own counter, which drops any point logged
    at a step lower than the last (a final evaluation logged without a step after the training steps)."""
    name = "wandb"

    def __init__(self, log_dir: Path, stage: str, run_id: str, parent: str | None):
        import wandb

        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        project = os.environ.get("WANDB_PROJECT") or os.environ.get(EXPERIMENT_ENV, DEFAULT_EXPERIMENT)
        self.run = wandb.init(project=project, name=stage, id=run_id, group=parent or run_id, job_type=stage,
                              dir=str(log_dir), mode=wandb_mode(), tags=[stage],
                              # console capture would wrap the stage's own output and progress lines
                              settings=wandb.Settings(console="off", silent=True))
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update({k: _scalar(v) for k, v in params.items()}, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int | None) -> None:
        self.run.log({**metrics, **({"step": step} if step is not None else {})})

    def set_tags(self, tags: dict[str, str]) -> None:
        self.run.config.update({f"tag.{k}": v for k, v in tags.items()}, allow_val_change=True)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


@contextmanager
def stage_run(stage: str, project_dir: Path, settings=None) -> Iterator[StageRun]:
    """A nested run under the pipeline's parent run, or a top-level run when a stage runs alone. Under a
    multi-process launcher (torchrun) only rank 0 records the stage; the other ranks get a QuietRun.
    `settings`: the `tracking` section (read from the project's params.yaml when not given). MLflow samples
    the machine's CPU, memory, disk, network (and GPUs, with nvidia-ml-py) as `system/...` metrics."""
    if int(os.environ.get("RANK", "0") or 0) > 0:
        yield QuietRun()
        return
    names = list((settings or tracking_settings(project_dir)).loggers)
    check_loggers(names)  # a missing extra fails the stage before it opens a run or starts work
    mlflow = _mlflow(project_dir)
    parent = os.environ.get(PARENT_ENV) or None
    with mlflow.start_run(run_name=stage, parent_run_id=parent, tags={"protege.stage": stage},
                          log_system_metrics=system_metrics_on()) as run:
        loggers = open_loggers(names, project_dir, stage, run.info.run_id, parent)
        failed = True
        try:
            yield StageRun(mlflow, run, project_dir, loggers)
            _tag_stage_outputs(mlflow, project_dir, stage)
            failed = False
        finally:
            for logger in loggers:
                logger.close(failed)


def start_parent_run(project_dir: Path, name: str, tags: dict[str, str] | None = None) -> str:
    mlflow = _mlflow(project_dir)
    run = mlflow.start_run(run_name=name, tags={"protege.pipeline": "true", **(tags or {})})
    mlflow.end_run()
    return run.info.run_id


def orchestration_overhead(client, run_id: str) -> dict[str, float]:
    """Where a pipeline run's wall time went: its stage runs' own durations, the stage processes' start-up
    before their run opened (python, torch, MLflow imports), and the rest (DVC, Prefect, this process)."""
    import time

    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'",
                                  max_results=1000)
    runs_s = sum(((c.info.end_time or c.info.start_time) - c.info.start_time) / 1000 for c in children)
    startup_s = sum(c.data.metrics.get("process_startup_s", 0.0) for c in children)
    wall_s = time.time() - parent.info.start_time / 1000
    if not runs_s:
        return {}
    return {"orchestration.wall_s": wall_s, "orchestration.stage_runs_s": runs_s,
            "orchestration.stage_startup_s": startup_s,
            "orchestration.other_s": wall_s - runs_s - startup_s, "orchestration.ratio": wall_s / runs_s}


def end_parent_run(project_dir: Path, run_id: str, status: str, metrics: dict[str, float] | None = None) -> dict:
    _mlflow(project_dir)
    from mlflow import MlflowClient

    client = MlflowClient()
    metrics = {**(metrics or {}), **orchestration_overhead(client, run_id)}
    for k, v in metrics.items():
        client.log_metric(run_id, k, float(v))
    client.set_terminated(run_id, status=status)
    return metrics


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
             scored_on: str = "", tags: dict[str, str] | None = None) -> str:
    """Registers a new version; it always takes alias `challenger` (the newest candidate), and `champion` only
    when the caller decided it wins."""
    mlflow = _mlflow(project_dir)
    from mlflow import MlflowClient

    mv = mlflow.register_model(f"models:/{model_id}", model_name,
                               tags={"protege.score": f"{score:.6f}", "protege.scored_on": scored_on, **(tags or {})})
    client = MlflowClient()
    client.set_registered_model_alias(model_name, "challenger", mv.version)
    if make_champion:
        client.set_registered_model_alias(model_name, "champion", mv.version)
    return mv.version


# --- lineage: which run wrote which DVC output, and what a registered version records ----------------------------

OUT_TAG = "protege.out."  # + output path -> its DVC hash, set on a stage's run when the stage returns
_TAG_CHARS = re.compile(r"[\w\-. /:]+")


def tag_key(prefix: str, path: str) -> str:
    """`prefix + path` when MLflow accepts it as a tag key, else `prefix` + a digest of the path (same every time,
    so lookups find it)."""
    key = prefix + path
    if _TAG_CHARS.fullmatch(key) and len(key) <= 250 and posixpath.normpath(key) == key:
        return key
    return f"{prefix}sha256-{hashlib.sha256(path.encode()).hexdigest()[:16]}"


def dvc_hashes(project_dir: Path, paths: list[str]) -> dict[str, str | None]:
    """The hash DVC gives each path in the working tree (md5, `.dir` for folders), None for a missing path.
    DVC's own hashing, with its state cache: unchanged files are not read again, and DVC reuses what this computes."""
    from dvc.repo import Repo
    from dvc_data.hashfile.build import build

    root = Path(project_dir).resolve()
    out: dict[str, str | None] = {}
    with Repo(str(root)) as repo:
        for rel in paths:
            full = root / rel
            if not full.exists():
                out[rel] = None
                continue
            _, _, obj = build(repo.cache.local, str(full), repo.fs, "md5", ignore=repo.dvcignore, dry_run=True)
            out[rel] = obj.hash_info.value
    return out


def dvc_stage_outputs(project_dir: Path, stage: str) -> list[str] | None:
    """Every output path (outs, metrics, plots) dvc.yaml declares for `stage`; None when it is not a dvc.yaml stage.
    Read straight from dvc.yaml (1.6 s less per stage than loading it through DVC); a templated path (`${...}`)
    is filled in by DVC's own loader."""
    root = Path(project_dir).resolve()
    if not (root / ".dvc").is_dir() or not (root / "dvc.yaml").is_file():
        return None
    spec = read_dvc_yaml(root).get(stage)
    if not isinstance(spec, dict):
        return None
    paths = [str(next(iter(o)) if isinstance(o, dict) else o)
             for key in ("outs", "metrics", "plots") for o in spec.get(key) or []]
    return paths if not any("${" in p for p in paths) else _templated_outputs(root, stage)


def _templated_outputs(root: Path, stage: str) -> list[str] | None:
    from dvc.repo import Repo
    from dvc.stage.exceptions import StageNotFound

    with Repo(str(root)) as repo:
        try:
            spec = repo.stage.load_one(str(root / "dvc.yaml"), stage)
        except StageNotFound:
            return None
        return [out.def_path for out in spec.outs]


def _tag_stage_outputs(mlflow, project_dir: Path, stage: str) -> None:
    """DVC writes dvc.lock only after the stage's command returns, so the run records the hashes of its outputs
    itself, computed as DVC computes them: `output_run` later finds the run behind any lock entry. A failure here
    is reported, never fatal: the stage's work is done."""
    try:
        outs = dvc_stage_outputs(project_dir, stage)
        if outs:
            hashes = dvc_hashes(project_dir, outs)
            mlflow.set_tags({tag_key(OUT_TAG, p): h for p, h in hashes.items() if h})
    except Exception as exc:  # noqa: BLE001 - lineage must not fail a finished stage
        msg = f"{type(exc).__name__}: {exc}"
        print(f"warning: {stage}: could not record the DVC hashes of its outputs ({msg}); "
              "`protege lineage` will not name this run", file=sys.stderr)
        mlflow.set_tag("protege.out_error", msg[:500])


def _client(project_dir: Path):
    """A client on the project's store that creates nothing (reading lineage must not add an experiment)."""
    import mlflow
    from mlflow import MlflowClient

    from protege.errors import UserFacingError

    uri = tracking_uri(project_dir)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise UserFacingError(f"no MLflow store at {uri[len('sqlite:///'):]} (set MLFLOW_TRACKING_URI or pass the "
                              "project folder that holds mlflow.db)")
    mlflow.set_tracking_uri(uri)
    return MlflowClient()


def output_run(project_dir: Path, path: str, digest: str) -> str | None:
    """The newest stage run (finished ones first) that wrote `path` with DVC hash `digest`, in any experiment."""
    client = _client(project_dir)
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return None
    key = tag_key(OUT_TAG, path)
    runs = client.search_runs(experiments, filter_string=f"tags.`{key}` = '{digest}'",
                              order_by=["attributes.start_time DESC"], max_results=50)
    runs = sorted(runs, key=lambda r: r.info.status != "FINISHED")  # stable: newest first within each group
    return runs[0].info.run_id if runs else None


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """(name, alias, version) of `models:/NAME@ALIAS` or `models:/NAME/VERSION`."""
    from protege.errors import UserFacingError

    rest = uri[len("models:/"):] if uri.startswith("models:/") else None
    if rest and "@" in rest:
        name, alias = rest.rsplit("@", 1)
        if name and alias:
            return name, alias, None
    elif rest and "/" in rest:
        name, version = rest.rsplit("/", 1)
        if name and version.isdigit():
            return name, None, version
    raise UserFacingError(f"{uri!r} is not a model URI: expected models:/NAME@ALIAS or models:/NAME/VERSION")


def model_version(project_dir: Path, uri: str) -> dict[str, Any]:
    """name, version, aliases, tags and source run of a registered version; a one-line error naming what is
    unknown (the model, the alias or the version)."""
    from mlflow.exceptions import MlflowException

    from protege.errors import UserFacingError

    name, alias, version = parse_model_uri(uri)
    client = _client(project_dir)
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # an unreachable or broken store is not "unknown"
            raise UserFacingError(f"{tracking_uri(project_dir)}: {str(exc).splitlines()[0]}") from None
        raise UserFacingError(f"no registered model '{name}' in {tracking_uri(project_dir)}") from None
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException as exc:
        # a missing alias is INVALID_PARAMETER_VALUE, a missing version RESOURCE_DOES_NOT_EXIST (MLflow 3.17)
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise UserFacingError(f"{tracking_uri(project_dir)}: {str(exc).splitlines()[0]}") from None
        what = f"alias '{alias}'" if alias else f"version {version}"
        raise UserFacingError(f"registered model '{name}' has no {what}") from None
    return {"name": name, "version": str(mv.version), "aliases": sorted(mv.aliases or []), "tags": dict(mv.tags),
            "run_id": mv.run_id}


def log_artifacts_to(project_dir: Path, run_id: str, paths: list[Path], artifact_path: str) -> None:
    client = _client(project_dir)
    for path in paths:
        client.log_artifact(run_id, str(path), artifact_path)


def read_artifact_text(project_dir: Path, artifact_uri: str) -> str:
    """The text of one artifact (`runs:/RUN/PATH`), through the tracking API (works against a server too)."""
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    from protege.errors import UserFacingError

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    _client(project_dir)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=tmp)
        except (MlflowException, OSError) as exc:
            raise UserFacingError(f"cannot read {artifact_uri}: {str(exc).splitlines()[0]}") from None
        return Path(got).read_text()


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



# --- retraining: the registry's champion as a checkpoint folder ------------------------------------------------

def export_model_version(project_dir: Path, model_name: str, alias: str, dst: Path) -> str | None:
    """Copies the checkpoint of `models:/NAME@ALIAS` (or `models:/NAME/VERSION` when `alias` is a number)
    into `dst` (replaced whole, never half-written); returns its version, or None when there is none."""
    import shutil
    import tempfile

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow = _mlflow(project_dir)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient()
        mv = (client.get_model_version(model_name, alias) if str(alias).isdigit()
              else client.get_model_version_by_alias(model_name, alias))
    except MlflowException:
        return None
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_name}/{mv.version}",
                                                       dst_path=tmp))
        old = dst.with_name(f".{dst.name}.old")
        if dst.exists():
            os.replace(dst, old)
        os.replace(got, dst)
        shutil.rmtree(old, ignore_errors=True)
    return mv.version
