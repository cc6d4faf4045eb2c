"""`protege study` on a tiny project: two runs (the SFT row and a few RIL steps) from shared upstream
artifacts, the report, one MLflow parent with nested runs, and a re-run that skips finished runs."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from protege.config import Config, RLConfig
from tests.conftest import REPO

TINY = {"world": {"n_train": 48, "n_rl": 12, "n_val": 4, "n_test": 12},
        "curate": {"select": 8},
        "sft": {"steps": 4, "batch_size": 8, "log_every": 2},
        "rollouts": {"samples_per_question": 2, "max_new_tokens": 6},
        "disc_pretrain": {"steps": 2, "batch_size": 8},
        "rl": {"steps": 2, "questions_per_step": 2, "group_size": 2, "save_every": 1, "max_new_tokens": 6},
        "evaluate": {"max_new_tokens": 6, "mini_items": 4, "bootstrap": 100}}
if "eval_every" in RLConfig.model_fields:  # no learning curve during these few steps
    TINY["rl"]["eval_every"] = 0

STUDY = """
seeds: [0]
baseline: ril
bootstrap: 200
common: {rl.algorithm: ril}
variants:
  sft: {train: false}
  ril: {}
preconditions:
  - {name: disc_separates, variant: ril, metric: disc_pretrain.heldout_auroc, kind: above, threshold: 0.6}
  - {name: similarity_in_range, variant: ril, metric: similarity_reward_student, kind: between, lo: 0.3, hi: 0.7}
claims:
  - {name: RIL beats its SFT start, better: ril, than: sft, metric: world_test}
  - {better: ril, than: sft, requires: [disc_separates, similarity_in_range]}
"""


class NoTracking:
    """What an upstream stage logs is not under test here."""

    def __getattr__(self, name):
        return lambda *a, **k: ""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder holding the shared upstream artifacts of tiny params (world .. disc_pretrain and
    the mini benchmarks), built by the stage recipes in this process."""
    import torch

    from protege.stages import stage_module

    torch.set_num_threads(1)
    proj = tmp_path_factory.mktemp("study_project")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in TINY.items():
        params[section].update(values)
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    cfg = Config.model_validate(params)
    for stage in ("world", "mini_benchmarks", "sft", "curate", "teachers", "rollouts", "disc_pretrain"):
        stage_module(stage).run(cfg, proj, NoTracking())
    (proj / "study.yaml").write_text(STUDY)
    return proj


def mlflow_runs(proj):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{proj / 'mlflow.db'}")
    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("protege").experiment_id])
    parents = [r for r in runs if r.data.tags.get("protege.study.parent") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in {p.info.run_id for p in parents}]
    return parents, children


def test_study_runs_reports_tracks_and_skips_finished_runs(project, monkeypatch, capsys):
    from protege.study.runner import plan, run_study
    from protege.study.spec import load_study

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    study = load_study(project / "study.yaml", project)
    paths = run_study(study, isolated=False)

    report = json.loads(paths["json"].read_text())
    assert set(report["variants"]) == {"sft", "ril"} and report["baseline"] == "ril"
    for v in report["variants"].values():
        for metric in ("world_test", "benchmark_average"):
            s = v["metrics"][metric]
            assert s["ci"][0] <= s["mean"] <= s["ci"][1] and s["seeds"] == 1
    assert report["variants"]["sft"]["vs_baseline"]["world_test"]["pairs"] == [[0, 0]]
    assert report["claims"][0]["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    # the second claim waits for RIL's preconditions, measured from the run's curve and the discriminator's figures
    by_name = {p["name"]: p for p in report["preconditions"]}
    auroc = by_name["disc_separates"]["per_seed"]["0"]
    assert auroc["met"] == (auroc["value"] > 0.6) and 0 <= auroc["value"] <= 1
    sim = by_name["similarity_in_range"]["per_seed"]["0"]
    assert sim["step"] == 1 and sim["met"] == (0.3 <= sim["value"] <= 0.7)
    met = all(p["status"] == "met" for p in by_name.values())
    assert (report["claims"][1]["verdict"] == "precondition not met") != met
    assert [r["name"] for r in report["claims"][1]["requires"]] == ["disc_separates", "similarity_in_range"]
    assert report["figures"] == ["signal"] and paths["md"].with_name("study.signal.png").stat().st_size > 1000
    assert report["claims"][0]["metric"] == "world_test" and report["claims"][1]["metric"] == "benchmark_average"
    md = paths["md"].read_text()
    assert "| **ril** (baseline) |" in md and "RIL beats its SFT start" in md
    assert paths["png"].stat().st_size > 1000

    folders = {p.run.key: p.folder for p in plan(study)}
    for key, folder in folders.items():
        result = json.loads((folder / "result.json").read_text())
        assert result["variant"] == key.split("/")[0]
        assert not (folder / "models/rl").exists() and not (folder / "models/merged").exists()  # results only
    ril = json.loads((folders["ril/seed-0"] / "result.json").read_text())
    assert [r["step"] for r in ril["curve"]] == [1, 2] and "similarity_reward_student" in ril["curve"][0]
    assert "heldout_auroc" in ril["upstream_metrics"]["disc_pretrain"]
    assert set(ril["models"]) == {"rl_final", "merged"} and len(ril["models"]["rl_final"]["benchmarks"]) == 14
    assert len(ril["models"]["merged"]["world_test"]["correct"]) == 12
    assert (folders["ril/seed-0"] / "data").is_symlink()

    parents, children = mlflow_runs(project)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].info.run_name == "study:study"
    assert {"ril.world_test", "sft.benchmark_average"} <= set(parents[0].data.metrics)
    assert sorted(c.data.tags["protege.variant"] for c in children) == ["ril", "sft"]
    by_variant = {c.data.tags["protege.variant"]: c for c in children}
    assert by_variant["ril"].data.params["rl.algorithm"] == "ril" and by_variant["ril"].data.params["seed"] == "0"
    assert {"world_test.accuracy", "benchmark_average", "merged.average"} <= set(by_variant["ril"].data.metrics)

    # a re-run skips both finished runs and keeps one parent with its two nested runs
    mtimes = {k: (f / "result.json").stat().st_mtime_ns for k, f in folders.items()}
    capsys.readouterr()
    run_study(load_study(project / "study.yaml", project), isolated=False)
    assert {k: (f / "result.json").stat().st_mtime_ns for k, f in folders.items()} == mtimes
    err = capsys.readouterr().err
    assert "sft/seed-0: finished earlier, skipped" in err and "ril/seed-0: finished earlier, skipped" in err
    parents, children = mlflow_runs(project)
    assert len(parents) == 1 and len(children) == 2

    # an unfinished run (no result) runs again in its own folder and MLflow run; the other stays as it was
    (folders["ril/seed-0"] / "result.json").unlink()
    run_study(load_study(project / "study.yaml", project), isolated=False)
    assert (folders["ril/seed-0"] / "result.json").exists()
    assert (folders["sft/seed-0"] / "result.json").stat().st_mtime_ns == mtimes["sft/seed-0"]
    parents, children = mlflow_runs(project)
    assert len(parents) == 1 and len(children) == 2

    # a changed variant is a new run: the old result no longer counts
    (project / "study.yaml").write_text(STUDY.replace("ril: {}", "ril: {rl.kl_beta: 0.1}"))
    assert [p.finished for p in plan(load_study(project / "study.yaml", project))] == [True, False]
    (project / "study.yaml").write_text(STUDY)


@pytest.mark.slow
def test_cli_runs_the_study_flow_in_worker_processes(project, tmp_path):
    """`protege study` through Prefect: a run in its own process, the other skipped as finished."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PREFECT_HOME=str(tmp_path / ".prefect"))
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PATH"] = str(REPO / ".venv/bin") + os.pathsep + env["PATH"]
    (project / "flow.yaml").write_text(STUDY.replace("seeds: [0]", "seeds: [5]"))
    cmd = [sys.executable, "-m", "protege.cli", "study", "flow.yaml", "--project", str(project), "--jobs", "2"]
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[ril/seed-5]" in out and (project / "reports/study/flow.md").exists()
    dry = subprocess.run([*cmd[:-2], "--dry-run"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert "2 runs, 2 finished, 0 to run" in dry.stdout, dry.stdout + dry.stderr
