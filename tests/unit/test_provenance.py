"""protege.json: what made a checkpoint, written inside a stage and only there."""
import json

import pytest

from protege import provenance
from protege.cli import stage_record
from protege.config import Config
from protege.models.student import save_student
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def no_stage():
    provenance.set_current(None)
    yield
    provenance.set_current(None)


def test_a_checkpoint_saved_inside_a_stage_holds_its_record(tiny_student, tiny_processor, tmp_path):
    save_student(tiny_student, tiny_processor, tmp_path / "outside")
    assert provenance.read(tmp_path / "outside") is None  # a library call writes none
    provenance.set_current({"stage": "sft", "params": {"sft": {"lr": 0.1}}})
    save_student(tiny_student, tiny_processor, tmp_path / "inside")
    assert json.loads((tmp_path / "inside" / "protege.json").read_text())["params"] == {"sft": {"lr": 0.1}}


def test_a_training_state_holds_the_record(tmp_path):
    import random

    from protege.runtime.state import save_state

    provenance.set_current({"stage": "rl"})
    save_state(tmp_path / "state", step=1, parts={}, py_rng=random.Random(0), cursor={}, fingerprint="f")
    assert provenance.read(tmp_path / "state") == {"stage": "rl"}


def test_the_stage_record_resolves_the_params_the_stage_reads(tmp_path):
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    (tmp_path / "data/curated").mkdir(parents=True)
    (tmp_path / "data/curated/rl.parquet").write_bytes(b"not really parquet")
    cfg = Config.model_validate({"rl": {"lr": 0.01}})
    record = stage_record("rl", cfg, tmp_path)
    assert record["stage"] == "rl" and record["params"]["rl"]["lr"] == 0.01 and record["params"]["seed"] == 0
    assert "sft" not in record["params"]  # only what rl reads
    # dvc.yaml's data deps that exist here (the curated folder; the SFT model and the others are absent)
    assert list(record["inputs"]) == ["data/curated"] and len(record["inputs"]["data/curated"]) == 32
    assert record["code"]["protege"] and record["code"]["git_commit"] is None  # no git repository here


def test_a_copied_or_merged_folder_does_not_inherit_its_inputs_record(tiny_student, tiny_processor, tmp_path):
    from protege.merging.config import parse_config
    from protege.merging.streaming import merge_folders
    from protege.models.hf_folder import copy_processor_files

    provenance.set_current({"stage": "rl"})
    save_student(tiny_student, tiny_processor, tmp_path / "a")
    provenance.set_current(None)
    copy_processor_files(tmp_path / "a", tmp_path / "copy")
    assert (tmp_path / "copy" / "tokenizer.json").exists() and provenance.read(tmp_path / "copy") is None
    merge_folders(parse_config({"merge_method": "linear", "models": [{"model": str(tmp_path / "a"),
                                                                      "parameters": {"weight": 1.0}}]}, source="t"),
                  tmp_path / "merged", overwrite=True)
    assert provenance.read(tmp_path / "merged") is None


def test_a_stage_run_in_process_leaves_no_record_behind(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from protege.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    result = CliRunner().invoke(app, ["stage", "validate"])
    assert result.exit_code == 1  # no world data here
    assert provenance.current() is None
