"""A stage reading dvc.lock while the flow commits another stage sees the whole file, old or new, never half."""
import threading
import time

import yaml

from protege.dvc_lockfile import dvc_writing, read_dvc_lock
from protege.tracking import dvc_digest


def test_a_reader_waits_for_a_commit_half_way_through(tmp_path):
    (tmp_path / ".dvc").mkdir()
    lock = tmp_path / "dvc.lock"
    whole = "schema: '2.0'\nstages:\n  sft:\n    outs:\n    - path: models/sft\n      hash: md5\n      md5: abc.dir\n"
    lock.write_text(whole)
    half_written = threading.Event()
    seen: list[str | None] = []

    def commit():
        with dvc_writing(tmp_path):
            with open(lock, "w") as f:  # DVC rewrites in place
                f.write(whole[:60])
                f.flush()
                half_written.set()
                time.sleep(0.3)
                f.write(whole[60:])

    writer = threading.Thread(target=commit)
    writer.start()
    half_written.wait()
    seen.append(read_dvc_lock(tmp_path))
    writer.join()
    assert seen == [whole]
    assert yaml.safe_load(seen[0])["stages"]["sft"]["outs"][0]["md5"] == "abc.dir"
    assert dvc_digest(tmp_path, "models/sft") == "abc.dir"


def test_no_lock_file_reads_as_none_and_without_dvc_folder_reads_unguarded(tmp_path):
    assert read_dvc_lock(tmp_path) is None
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    assert read_dvc_lock(tmp_path) == "stages: {}\n"
    assert not (tmp_path / ".dvc").exists()  # reading made no guard folder in a non-DVC folder


DVC_YAML = """stages:
  sft:
    cmd: protege stage sft
    deps: [models/base]
    outs: [models/sft, {models/.state/sft: {persist: true}}]
    metrics: [{reports/stages/sft.json: {cache: false}}]
  evaluate:
    cmd: protege stage evaluate
    deps: [models/sft]
    outs: ["reports/${world.name}"]
"""


def test_a_stage_without_a_lock_record_or_with_an_out_missing_runs_without_asking_dvc(tmp_path, monkeypatch):
    from protege import pipeline

    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    asked: list[tuple] = []
    monkeypatch.setattr(pipeline, "_dvc", lambda root, *args: asked.append(args) or "{}")
    assert pipeline.stage_changed(tmp_path, "sft")  # no dvc.lock yet
    (tmp_path / "dvc.lock").write_text("schema: '2.0'\nstages:\n  sft:\n    cmd: protege stage sft\n")
    assert pipeline.stage_changed(tmp_path, "sft")  # recorded, but models/sft is gone
    assert asked == []
    (tmp_path / "models" / "sft").mkdir(parents=True)
    assert pipeline.stage_changed(tmp_path, "sft")  # a persisted out is an out too
    (tmp_path / "models" / ".state" / "sft").mkdir(parents=True)
    assert not pipeline.stage_changed(tmp_path, "sft")  # everything there: DVC decides (here: up to date)
    assert asked == [("status", "--json", "sft")]


def test_stage_outputs_are_read_from_dvc_yaml_and_a_templated_one_goes_through_dvc(tmp_path, monkeypatch):
    from protege import tracking

    assert tracking.dvc_stage_outputs(tmp_path, "sft") is None  # not a DVC project
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    assert tracking.dvc_stage_outputs(tmp_path, "sft") == ["models/sft", "models/.state/sft", "reports/stages/sft.json"]
    assert tracking.dvc_stage_outputs(tmp_path, "nope") is None
    monkeypatch.setattr(tracking, "_templated_outputs", lambda root, stage: [f"filled by DVC for {stage}"])
    assert tracking.dvc_stage_outputs(tmp_path, "evaluate") == ["filled by DVC for evaluate"]


def test_the_fast_parser_reads_what_the_safe_one_reads():
    from protege.dvc_lockfile import parse_dvc_file

    text = DVC_YAML + "vars:\n  - seed: 7\n    lr: 2.0e-3\n    on: yes\n"
    assert parse_dvc_file(text) == yaml.safe_load(text)
