"""Loggers beside MLflow (`tracking.loggers`) and MLflow's system metrics on a stage run: TensorBoard's event
files and wandb's offline run hold what the stage logged, a missing extra is named before any run opens, and
MLflow stays on."""
from __future__ import annotations

import importlib.util
import json
import os
import struct
import time
from pathlib import Path

import pytest

from protege import tracking
from protege.config import ConfigError, Config, TrackingConfig, load_config
from protege.errors import UserFacingError


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow store for the file: creating a sqlite store costs seconds of schema migrations."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture
def project(tmp_path, monkeypatch, store) -> Path:
    """A project folder outside any pipeline run; system metrics off unless a test turns them on (their
    sampler has nothing to show in a run this short)."""
    for var in (tracking.PARENT_ENV, tracking.EXPERIMENT_ENV, "RANK", "WANDB_API_KEY", "WANDB_MODE",
                "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    return tmp_path


def settings(*loggers: str) -> TrackingConfig:
    return TrackingConfig(loggers=["mlflow", *loggers])


def log_a_little(run) -> None:
    run.log_params({"sft": {"lr": 0.002, "steps": 3, "schedule": "cosine", "device": None}})
    for step in range(3):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    run.log_metrics({"val_accuracy": 0.75})  # a figure without a step, after the stepped ones


def mlflow_run(project: Path, run_id: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking.tracking_uri(project)).get_run(run_id)


# --- the setting -------------------------------------------------------------------------------------------------

def test_mlflow_alone_by_default_and_always_in_the_list(tmp_path):
    assert Config().tracking.loggers == ["mlflow"]
    assert TrackingConfig(loggers=["mlflow", "wandb", "tensorboard"]).loggers == ["mlflow", "wandb", "tensorboard"]
    params = tmp_path / "params.yaml"
    params.write_text("tracking:\n  loggers: [tensorboard]\n")
    with pytest.raises(ConfigError, match=r"tracking.loggers.*leaves out mlflow: MLflow is always on"):
        load_config(params)
    params.write_text("tracking:\n  loggers: [mlflow, neptune]\n")
    with pytest.raises(ConfigError, match=r"tracking.loggers"):
        load_config(params)
    with pytest.raises(ValueError, match="twice"):
        TrackingConfig(loggers=["mlflow", "wandb", "wandb"])


def test_a_stage_reads_the_setting_from_the_projects_params(tmp_path):
    assert tracking.tracking_settings(tmp_path).loggers == ["mlflow"]  # no params.yaml: the default
    (tmp_path / "params.yaml").write_text("seed: 3\ntracking:\n  loggers: [mlflow, tensorboard]\n")
    assert tracking.tracking_settings(tmp_path).loggers == ["mlflow", "tensorboard"]


def test_a_missing_extra_is_named_before_any_run_opens(project, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    monkeypatch.setattr(tracking, "_mlflow", lambda *a: pytest.fail("an MLflow run was opened"))
    with pytest.raises(UserFacingError, match=r"wandb package is not installed: pip install -e '\.\[wandb\]'"):
        with tracking.stage_run("sft", project, settings("wandb")):
            pytest.fail("the stage must not start")


def test_wandb_runs_offline_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert tracking.wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert tracking.wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.wandb_mode() == "disabled"


def test_a_failing_logger_is_dropped_and_mlflow_keeps_the_record(project, capsys):
    class Broken:
        name = "broken"

        def log_metrics(self, metrics, step):
            raise OSError("No space left on device")

        def close(self, failed):
            pass

    with tracking.stage_run("sft", project) as run:
        run.loggers.append(Broken())
        run.log_metrics({"loss": 1.0}, step=0)
        run.log_metrics({"loss": 0.5}, step=1)
    assert "broken: stopped logging this run (OSError: No space left on device)" in capsys.readouterr().err
    assert run.loggers == [] and mlflow_run(project, run.run_id).data.metrics["loss"] == 0.5


# --- TensorBoard -------------------------------------------------------------------------------------------------

def test_tensorboard_event_files_hold_the_logged_metrics(project):
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed (pip install -e '.[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    (project / "params.yaml").write_text("tracking:\n  loggers: [mlflow, tensorboard]\n")
    with tracking.stage_run("sft", project) as run:  # the setting read from the project's params.yaml
        log_a_little(run)
    folder = project / "logs" / "tensorboard" / "sft" / run.run_id  # one TensorBoard run per MLflow run
    assert list(folder.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("loss")] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    assert [e.value for e in events.Scalars("val_accuracy")] == [0.75]
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["sft.lr"].number_value == 0.002 and hparams["sft.schedule"].string_value == "cosine"
    assert hparams["sft.device"].string_value == "null"
    # MLflow got the same
    assert mlflow_run(project, run.run_id).data.params["sft.lr"] == "0.002"


# --- wandb -------------------------------------------------------------------------------------------------------

def wandb_records(run_file: Path) -> list:
    """The records of a wandb transaction log (`run-ID.wandb`): a 7-byte header, then LevelDB-log style chunks
    (crc32, length, type; FULL=1, FIRST=2, MIDDLE=3, LAST=4) in 32 KiB blocks, each record a protobuf."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, buf, out = run_file.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # the rest of a block is padding
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def test_wandb_offline_run_holds_the_logged_metrics(project):
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed (pip install -e '.[wandb]')")
    with tracking.stage_run("sft", project, settings("wandb")) as run:
        log_a_little(run)
        run.set_tags({"elastic_restarts": "1"})
    (folder,) = (project / "logs" / "wandb").glob(f"offline-run-*-{run.run_id}")  # its id: the MLflow run's
    records = wandb_records(folder / f"run-{run.run_id}.wandb")
    (started,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.display_name == "sft" and started.run_id == run.run_id and started.project == "protege"
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["step"], round(h["loss"], 4)) for h in history if "loss" in h] == [(0, 1.0), (1, 0.5), (2, 0.3333)]
    assert [h["val_accuracy"] for h in history if "val_accuracy" in h] == [0.75]
    config = {u.key or "/".join(u.nested_key): json.loads(u.value_json) for r in records
              if r.WhichOneof("record_type") == "config"
              for u in r.config.update}
    assert config["sft.lr"] == 0.002 and config["sft.device"] is None and config["tag.elastic_restarts"] == "1"
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]


# --- MLflow system metrics ---------------------------------------------------------------------------------------

def test_a_stage_run_records_system_metrics(project, monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")  # protege's default is 15 s
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    with tracking.stage_run("sft", project) as run:
        time.sleep(0.8)  # several samples; the last batch is written when the run ends
    metrics = mlflow_run(project, run.run_id).data.metrics
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(metrics)


def test_system_metrics_default_to_a_long_stages_interval_and_can_be_turned_off(monkeypatch):
    for var in ("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING",
                "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"):
        monkeypatch.setenv(var, "")  # recorded, so what system_metrics_on sets is undone after the test
        monkeypatch.delenv(var)
    assert tracking.system_metrics_on()
    assert float(os.environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"]) == tracking.SYSTEM_METRICS_INTERVAL_S
    assert int(os.environ["MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING"]) == tracking.SYSTEM_METRICS_SAMPLES
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "60")
    assert tracking.system_metrics_on() and os.environ["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] == "60"
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    assert not tracking.system_metrics_on()
