"""Lineage on a small synthetic pipeline: git + DVC + an MLflow sqlite store, registered through promote."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from protege import lineage, tracking
from protege.cli import app

STAGE_SCRIPT = '''
import json, shutil, sys
from pathlib import Path
import yaml
from protege import tracking

name, root = sys.argv[1], Path.cwd()
with tracking.stage_run(name, root) as run:
    if name == "prep":
        shutil.copytree(root / "raw/images", root / "data/prep/images", dirs_exist_ok=True)
        (root / "data/table.csv").write_text((root / "raw/table.csv").read_text().upper())
    elif name == "pretrain":
        (root / "models/base").mkdir(parents=True, exist_ok=True)
        (root / "models/base/model.safetensors").write_bytes(b"base weights")
    elif name == "train":
        score = yaml.safe_load((root / "toy.yaml").read_text())["score"]
        (root / "models/student").mkdir(parents=True, exist_ok=True)
        weights = (root / "models/base/model.safetensors").read_bytes() + (root / "data/table.csv").read_bytes()
        (root / "models/student/model.safetensors").write_bytes(weights + str(score).encode())
        (root / "reports").mkdir(exist_ok=True)
        (root / "reports/eval.json").write_text(json.dumps({
            "candidate": "student", "score": score, "suite": "toy", "protocol": "toy",
            "models": {"student": {"path": "models/student"}}}))
'''

DVC_YAML = {"stages": {
    "prep": {"cmd": "python stage.py prep", "deps": ["stage.py", "raw/table.csv", "raw/images"],
             "outs": ["data/prep", "data/table.csv"]},
    "pretrain": {"cmd": "python stage.py pretrain", "deps": ["stage.py"], "outs": ["models/base"]},
    "train": {"cmd": "python stage.py train", "deps": ["stage.py", "data/prep/images", "data/table.csv", "models/base"],
              "params": [{"toy.yaml": ["score"]}],
              "outs": ["models/student", {"reports/eval.json": {"cache": False}}]},
    "promote": {"cmd": "protege stage promote", "deps": ["reports/eval.json"], "params": ["promote"],
                "outs": [{"reports/promotion.json": {"cache": False}}]},
}}
MODEL = "toy-student"
GIT = ["git", "-c", "user.name=protege-test", "-c", "user.email=test@protege.invalid"]


def project_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", tracking.PARENT_ENV, tracking.EXPERIMENT_ENV)}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    return env


def repro(proj: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=proj, env=project_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """Two registrations: v1 (score 0.5, champion) and v2 (score 0.4: challenger only, the tree now holds it)."""
    proj = tmp_path_factory.mktemp("lineage") / "proj"
    (proj / "raw/images").mkdir(parents=True)
    (proj / "raw/table.csv").write_text("question,answer\nwhat,that\n")
    (proj / "raw/images/a.txt").write_text("pixel a")
    (proj / "raw/images/b.txt").write_text("pixel b")
    (proj / "stage.py").write_text(STAGE_SCRIPT)
    (proj / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    (proj / "toy.yaml").write_text("score: 0.5\n")
    (proj / "params.yaml").write_text(f"promote:\n  model_name: {MODEL}\n  margin: 0.0\n")
    (proj / ".gitignore").write_text("/mlflow.db\n/mlartifacts/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "toy pipeline"]):
        subprocess.run(GIT + args, cwd=proj, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=proj, check=True, env=project_env())
    repro(proj)
    lock_v1 = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    (proj / "toy.yaml").write_text("score: 0.4\n")
    repro(proj)
    return proj, lock_v1


def cli(proj: Path, *args: str):
    return CliRunner().invoke(app, ["lineage", *args, "--project", str(proj)])


@pytest.fixture(autouse=True)
def _store_of_the_project(monkeypatch):
    for key in ("MLFLOW_TRACKING_URI", tracking.PARENT_ENV, tracking.EXPERIMENT_ENV):
        monkeypatch.delenv(key, raising=False)


def lock_hashes(stages: dict) -> dict[str, str]:
    return {e["path"]: e["md5"] for st in stages.values() for e in st.get("deps", []) + st.get("outs", [])}


def client_of(proj: Path):
    return tracking._client(proj)


def test_each_version_carries_its_lineage_and_aliases(toy):
    proj, lock_v1 = toy
    client = client_of(proj)
    v1 = client.get_model_version(MODEL, "1")
    v2 = client.get_model_version(MODEL, "2")
    assert sorted(v1.aliases) == ["champion"] and sorted(v2.aliases) == ["challenger"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=proj, capture_output=True, text=True).stdout.strip()
    t = v2.tags
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    assert t["protege.lineage.git_commit"] == head and t["protege.lineage.git_dirty"] == "true"
    assert t["protege.lineage.params_sha256"] == hashlib.sha256((proj / "params.yaml").read_bytes()).hexdigest()
    assert len(t["protege.lineage.dvc_lock_sha256"]) == 64
    assert t["protege.lineage.teacher_index_sha256"] == "absent"
    assert t["protege.lineage.checkpoint"] == "models/student" and t["protege.lineage.stage"] == "train"
    assert t["protege.lineage.checkpoint_md5"] == lock["train"]["outs"][0]["md5"]
    hashes = lock_hashes(lock)
    for path in ("raw/table.csv", "raw/images", "data/prep/images", "data/table.csv"):
        assert t[f"protege.lineage.data.{path}"] == hashes[path], path
    train_run = client.get_run(t["protege.lineage.run"])
    assert train_run.data.tags["protege.stage"] == "train"
    assert train_run.data.tags["protege.out.models/student"] == lock["train"]["outs"][0]["md5"]
    parent = client.get_run(t["protege.lineage.parent.models/base"])
    assert parent.data.tags["protege.stage"] == "pretrain"
    # v1 names the checkpoint of the first run, whose train run is a different one
    assert v1.tags["protege.lineage.checkpoint_md5"] == lock_v1["train"]["outs"][0]["md5"] != t[
        "protege.lineage.checkpoint_md5"]
    assert v1.tags["protege.lineage.run"] != t["protege.lineage.run"]
    promote_run = t["protege.lineage.record"].split("/")[1]
    logged = {a.path for a in client.list_artifacts(promote_run, "lineage")}
    assert logged == {"lineage/lineage.json", "lineage/dvc.lock", "lineage/params.yaml"}
    assert all(len(v) <= 500 for v in t.values())


def test_chain_reaches_the_sources_with_dvc_hashes(toy):
    proj, _ = toy
    result = cli(proj, "models:/toy-student@challenger", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    report = json.loads(result.stdout)
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    hashes = lock_hashes(lock)
    assert report["model"]["version"] == "2" and report["model"]["aliases"] == ["challenger"]
    assert [s["stage"] for s in report["stages"]] == ["train", "prep", "pretrain"]
    assert report["checkpoint"]["md5"] == report["checkpoint"]["current"] == hashes["models/student"]
    srcs = {s["path"]: s for s in report["sources"]}
    assert set(srcs) == {"raw/table.csv", "raw/images", "models/base"}  # models/base: pretrain reads only code
    for path, s in srcs.items():
        assert s["md5"] == s["current"] == hashes[path] and s["status"] == "ok", path
    assert hashes["raw/images"].endswith(".dir")
    train = report["stages"][0]
    assert {d["path"]: d["kind"] for d in train["deps"]} == {
        "data/prep/images": "data", "data/table.csv": "data", "models/base": "checkpoint", "stage.py": "code"}
    assert {d["path"]: d["from"] for d in train["deps"]}["models/base"] == ["pretrain"]
    runs = {s["stage"]: s["run_id"] for s in report["stages"]}
    assert all(runs.values()) and len(set(runs.values())) == 3
    assert report["mismatches"] == [] and report["warnings"] == []


def test_text_form_names_every_stage_and_hash(toy):
    proj, _ = toy
    result = cli(proj, "models:/toy-student/2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    assert out.startswith("toy-student v2  aliases: challenger  candidate: student")
    for stage in ("train", "prep", "pretrain"):
        assert f"\n{stage}  run " in out, stage
    lines = out.splitlines()
    for dep in lock["prep"]["deps"]:
        if dep["path"] != "stage.py":
            row = next(ln.split() for ln in lines if ln.strip().startswith(dep["path"]))
            assert row == [dep["path"], dep["md5"], "ok", "<-", "no", "stage", "(source)"], row
    assert "\ntrain  run " in out and "params: toy.yaml:score" in out
    assert "code: 1 path, all match" in out and "match the working tree" in out


def test_an_older_version_warns_about_what_changed_since(toy):
    proj, lock_v1 = toy
    result = cli(proj, "models:/toy-student@champion", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    changed = {m["path"]: m for m in report["mismatches"]}
    # the second run changed a param of train and so its checkpoint; the data it read is the same
    assert set(changed) == {"models/student", "toy.yaml:score"}, changed
    assert (changed["toy.yaml:score"]["recorded"], changed["toy.yaml:score"]["current"]) == (0.5, 0.4)
    assert report["checkpoint"]["md5"] == lock_v1["train"]["outs"][0]["md5"]
    assert "warning: models/student: recorded " + lock_v1["train"]["outs"][0]["md5"] in result.stderr
    assert "warning: toy.yaml:score (read by train): recorded 0.5, now 0.4" in result.stderr


def test_an_edited_raw_file_is_a_warning(toy, tmp_path):
    proj, _ = toy
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy)
    (copy / "raw/table.csv").write_text("question,answer\nwhat,this\n")
    result = cli(copy, "models:/toy-student@challenger")
    assert result.exit_code == 0, result.output
    assert "warning: raw/table.csv: recorded " in result.stderr
    line = next(ln for ln in result.stdout.splitlines() if ln.strip().startswith("raw/table.csv"))
    assert "CHANGED, now " in line
    assert "1 recorded value(s) no longer match" in result.stdout
    assert "raw/images" not in result.stderr


@pytest.mark.parametrize("uri, message", [
    ("models:/no-such-model@champion", "no registered model 'no-such-model'"),
    ("models:/toy-student@gold", "registered model 'toy-student' has no alias 'gold'"),
    ("models:/toy-student/9", "registered model 'toy-student' has no version 9"),
    ("toy-student", "is not a model URI"),
])
def test_bad_model_uris_are_one_line_errors(toy, uri, message):
    proj, _ = toy
    result = cli(proj, uri)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_project_without_dvc_lock_is_an_error(toy, tmp_path):
    result = cli(tmp_path, "models:/toy-student@champion")
    assert result.exit_code == 1
    assert result.stderr.strip() == (f"error: {tmp_path.resolve() / 'dvc.lock'} not found: lineage follows the DVC "
                                     "pipeline's lock (run `dvc repro` or `protege pipeline` first, or pass --project)")


def test_a_version_without_lineage_tags_is_an_error(toy):
    proj, _ = toy
    client = client_of(proj)
    client.create_registered_model("bare-model")
    client.create_model_version("bare-model", source=(proj / "models/student").as_uri())
    result = cli(proj, "models:/bare-model/1")
    assert result.exit_code == 1
    assert "bare-model v1 has no lineage tags (protege.lineage.*)" in result.stderr


def test_the_walk_follows_files_inside_output_folders():
    stages = {"a": {"deps": [{"path": "raw.csv"}], "outs": [{"path": "data/w"}]},
              "b": {"deps": [{"path": "data/w/train.parquet"}], "outs": [{"path": "models/rl"}]},
              "c": {"deps": [{"path": "models/rl/step-2"}, {"path": "data/w"}], "outs": [{"path": "models/m"}]},
              "d": {"deps": [{"path": "models/m"}], "outs": [{"path": "reports/x.json"}]}}
    assert lineage.walk(stages, "models/m") == ["c", "b", "a"]
    assert lineage.walk(stages, "models/rl/step-2") == ["b", "a"]
    assert lineage.walk(stages, "raw.csv") == []
    assert lineage.producers(stages, "data") == ["a"]  # a dep above an output folder


def test_tag_keys_fall_back_to_a_digest_for_odd_paths():
    assert tracking.tag_key("protege.out.", "data/world/images") == "protege.out.data/world/images"
    odd = tracking.tag_key("protege.out.", "data/a@b.csv")
    assert odd.startswith("protege.out.sha256-") and odd == tracking.tag_key("protege.out.", "data/a@b.csv")


def test_dirty_means_tracked_code_or_params_differ(tmp_path):
    """Outputs, DVC's .gitignore files and DVC's own records (dvc.lock, *.dvc, committed or not) leave a
    checkout clean; an edited tracked file makes it dirty."""
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "params.yaml").write_text("a: 1\n")
    (tmp_path / "dvc.lock").write_text("stages: {}\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pool.dvc").write_text("outs: []\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "code"]):
        subprocess.run(GIT + args, cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "data" / ".gitignore").write_text("/world\n")
    (tmp_path / "data" / "world").mkdir()
    (tmp_path / "data" / "world" / "train.parquet").write_bytes(b"rows")
    (tmp_path / "dvc.lock").write_text("stages: {world: {}}\n")
    (tmp_path / "data" / "pool.dvc").write_text("outs: [{md5: abc}]\n")
    state = lineage.git_state(tmp_path)
    assert state["dirty"] is False and state["changed"] == [], state
    (tmp_path / "params.yaml").write_text("a: 2\n")
    state = lineage.git_state(tmp_path)
    assert state["dirty"] is True and state["changed"] == ["params.yaml"], state
