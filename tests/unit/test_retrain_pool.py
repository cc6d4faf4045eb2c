"""Retraining's library half: the inbox -> pool admission, the workspace lock, params edits, model URIs and
the orchestration section. (The deployments themselves: tests/flows/service_retrain.py, collected in test_pipeline.py.)"""
import io
import json
import multiprocessing
import shutil
import time

import pandas as pd
import pytest
from PIL import Image

from protege.config import ConfigError, load_config
from protege.errors import UserFacingError
from protege.pipeline import set_param
from protege.pool import ARCHIVE, INCOMING, POOL, REJECTED, admit_incoming, pool_tables
from protege.registry_eval import parse_model_uri
from protege.workspace import WorkspaceBusy, workspace_lock
from tests.conftest import REPO


def png(colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buf, format="PNG")
    return buf.getvalue()


def table(n: int, colour=(200, 0, 0)) -> bytes:
    df = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "question": [f"What colour is shape {i}?" for i in range(n)],
                       "answer": ["red"] * n, "image": [png(colour)] * n})
    buf = io.BytesIO()
    df.to_parquet(buf)
    return buf.getvalue()


def test_a_good_file_becomes_one_pool_batch_and_is_archived(tmp_path):
    inbox = tmp_path / INCOMING
    inbox.mkdir(parents=True)
    (inbox / "a.parquet").write_bytes(table(3))
    (inbox / "b.parquet.part").write_bytes(b"still being copied")  # left alone
    (inbox / "notes.txt").write_text("not a dataset")                # left alone, reported
    res = admit_incoming(tmp_path, "run1")
    assert len(res.accepted) == 1 and res.rejected == {} and res.skipped == ["notes.txt"]
    [t] = pool_tables(tmp_path)
    assert len(pd.read_parquet(t)) == 3
    meta = json.loads((t.parent / "batch.json").read_text())
    assert meta["source"] == "a.parquet" and meta["run_id"] == "run1" and meta["rows"] == 3
    assert (tmp_path / ARCHIVE / "run1" / "a.parquet").exists() and not (inbox / "a.parquet").exists()
    assert (inbox / "b.parquet.part").exists() and (inbox / "notes.txt").exists()


def test_the_same_file_twice_is_one_batch(tmp_path):
    inbox = tmp_path / INCOMING
    inbox.mkdir(parents=True)
    data = table(2)
    (inbox / "a.parquet").write_bytes(data)
    admit_incoming(tmp_path, "run1")
    (inbox / "again.parquet").write_bytes(data)
    res = admit_incoming(tmp_path, "run2")
    assert res.accepted == [] and len(res.already_pooled) == 1 and len(pool_tables(tmp_path)) == 1
    assert (tmp_path / ARCHIVE / "run2" / "again.parquet").exists()


def test_a_bad_file_is_rejected_with_its_report_and_the_pool_is_untouched(tmp_path):
    inbox = tmp_path / INCOMING
    inbox.mkdir(parents=True)
    (inbox / "good.parquet").write_bytes(table(2))
    admit_incoming(tmp_path, "run1")
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / POOL).rglob("*"))
    (inbox / "bad.jsonl").write_text('{"id": "x", "image": "nowhere.png", "conversations": '
                                     '[{"from": "human", "value": "<image>\\nQ?"}, {"from": "gpt", "value": "A"}]}\n'
                                     "{broken json\n")
    (inbox / "junk.parquet").write_bytes(b"PAR1 not really")
    res = admit_incoming(tmp_path, "run2")
    assert res.accepted == [] and sorted(res.rejected) == ["bad.jsonl", "junk.parquet"]
    assert "line 2" in res.rejected["bad.jsonl"] or "bad.jsonl:2" in res.rejected["bad.jsonl"]
    for name in ("bad.jsonl", "junk.parquet"):
        moved = tmp_path / REJECTED / "run2" / name
        report = json.loads(moved.with_name(name + ".report.json").read_text())
        assert moved.exists() and report["file"] == name and report["error"] == res.rejected[name]
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / POOL).rglob("*")) == before
    assert list(inbox.iterdir()) == []


def _hold(path, seconds):
    with workspace_lock(path, "holder"):
        time.sleep(seconds)
        (path / "holder-done").write_text("")  # still holding the lock


def test_a_second_writer_is_refused_or_waits(tmp_path):
    proc = multiprocessing.get_context("fork").Process(target=_hold, args=(tmp_path, 3))
    proc.start()
    time.sleep(1)
    try:
        with pytest.raises(WorkspaceBusy, match="holder"):
            with workspace_lock(tmp_path, "second", wait_s=0):
                pass
        waited = []
        with workspace_lock(tmp_path, "third", wait_s=30, poll_s=0.2, on_wait=waited.append):
            assert (tmp_path / "holder-done").exists()  # the lock came only after the holder let it go
        assert waited and "holder" in waited[0]
    finally:
        proc.join()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    proc = multiprocessing.get_context("fork").Process(target=_hold, args=(tmp_path, 60))
    proc.start()
    time.sleep(1)
    proc.kill()
    proc.join()
    with workspace_lock(tmp_path, "after a kill", wait_s=0):
        pass


def test_set_param_keeps_comments_and_refuses_a_bad_value(tmp_path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    assert set_param(tmp_path, "sft.init", "models/champion")
    text = (tmp_path / "params.yaml").read_text()
    assert "init: models/champion" in text and "# short on purpose" in text
    assert load_config(tmp_path / "params.yaml").sft.init == "models/champion"
    assert not set_param(tmp_path, "sft.init", "models/champion")  # unchanged: no rewrite
    with pytest.raises(ConfigError, match="sft.init") as err:
        set_param(tmp_path, "sft.init", "../elsewhere")
    assert ".check" not in str(err.value)  # the message names params.yaml, not the copy it checked
    assert (tmp_path / "params.yaml").read_text() == text


@pytest.mark.parametrize("uri,expected", [("models:/protege-student@champion", ("protege-student", "champion")),
                                          ("models:/m/3", ("m", "3"))])
def test_model_uris(uri, expected):
    assert parse_model_uri(uri) == expected


@pytest.mark.parametrize("uri", ["protege-student", "models:/", "models:/m@", "models:/m/v3", "runs:/abc/model"])
def test_bad_model_uris(uri):
    with pytest.raises(UserFacingError, match="expected models:/NAME@ALIAS"):
        parse_model_uri(uri)


def test_orchestration_pools(tmp_path):
    cfg = load_config(REPO / "params.yaml").orchestration
    assert cfg.pool_of("rl") == "gpu" and cfg.pool_of("curate") == "cpu"
    bad = (REPO / "params.yaml").read_text().replace("stage_pools: {sft: gpu,", "stage_pools: {sftt: gpu,")
    (tmp_path / "params.yaml").write_text(bad)
    with pytest.raises(ConfigError, match="unknown stage 'sftt'"):
        load_config(tmp_path / "params.yaml")
