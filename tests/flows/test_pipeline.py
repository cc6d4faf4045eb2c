"""End to end: the Prefect flow runs every dvc.yaml stage on a tiny world, tracked in MLflow."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from protege import stage_host
from tests.conftest import REPO

TINY = {"world": {"n_train": 64, "n_rl": 12, "n_val": 8, "n_test": 16},
        "curate": {"select": 8},
        "sft": {"steps": 4, "batch_size": 8, "log_every": 2},
        "rollouts": {"samples_per_question": 2, "max_new_tokens": 6},
        "disc_pretrain": {"steps": 2, "batch_size": 8},
        "rl": {"steps": 2, "questions_per_step": 2, "group_size": 2, "save_every": 1, "max_new_tokens": 6,
               "eval_every": 1, "eval_items": 8},  # rl.baseline stays dr_grpo: the flow runs rl_baseline too
        "evaluate": {"max_new_tokens": 6, "mini_items": 8, "bootstrap": 200},
        "agent": {"grid": {"max_turns": 2}, "sft": {"episodes": 8, "steps": 2, "batch_size": 4},
                  "rl": {"steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6, "save_every": 1},
                  "eval_episodes": 4},
        "tool": {"sft": {"episodes": 8, "steps": 2, "batch_size": 4},
                 "rl": {"steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 8, "save_every": 1},
                 "eval_episodes": 4}}


def tiny_params(**rl_overrides) -> str:
    """The repository's params.yaml (every key DVC tracks) with tiny sizes."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in TINY.items():
        for key, value in values.items():  # one level down: agent.rl keeps its gtr settings
            if isinstance(value, dict) and isinstance(params[section].get(key), dict):
                params[section][key].update(value)
            else:
                params[section][key] = value
    # the demo's value warm-up (5 steps) is longer than these 2: one step of it, then one PPO update
    params["agent"]["rl"]["ppo"]["value_warmup_steps"] = 1
    params["rl"].update(rl_overrides)
    return yaml.safe_dump(params)


def make_project(tmp_path: Path) -> Path:
    """A project folder like a user's clone: the DAG, tiny params, and the code dvc.yaml tracks."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(REPO / "dvc.yaml", proj / "dvc.yaml")
    shutil.copytree(REPO / "protege", proj / "protege", ignore=shutil.ignore_patterns("__pycache__"))
    (proj / "params.yaml").write_text(tiny_params())
    env = project_env(proj)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=proj, check=True, env=env)
    return proj


def project_env(proj: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    env["PREFECT_HOME"] = str(proj / ".prefect")
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def run_flow(proj: Path) -> subprocess.CompletedProcess:
    """`protege pipeline`, the command `make demo` runs: its checks, then the flow."""
    return subprocess.run([sys.executable, "-m", "protege", "pipeline", "--project", str(proj)], cwd=REPO,
                          env=project_env(proj), capture_output=True, text=True, timeout=900)


def mlflow_client(proj: Path):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{proj / 'mlflow.db'}")
    return MlflowClient()


@pytest.mark.slow
def test_flow_runs_every_stage_and_leaves_dvc_clean(finished_project, tmp_path):
    proj, proc = finished_project.path, finished_project.flow
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    for rel in ("data/world/train.parquet", "models/base/model.safetensors", "reports/validation.json",
                "data/curated/rl.parquet", "reports/curation/histograms.png", "reports/curation/logprob.csv",
                "data/teachers/concise/index.json", "data/teachers/verbose/shard-000000.parquet",
                "data/teacher_answers.parquet",
                "models/sft/model.safetensors", "data/rollouts/student.parquet",
                "models/discriminator/head.safetensors", "models/rl/step-00002/model.safetensors",
                "models/merged/model.safetensors", "reports/eval.md", "reports/eval.png", "reports/promotion.json",
                "data/benchmarks/mmbench/mmbench.tsv", "data/benchmarks/mmvet/mmvet.json",
                "reports/eval/merged/blink/items.jsonl", "models/rl_baseline/step-00002/model.safetensors",
                "reports/eval/dr_grpo_final/blink/items.jsonl", "models/agent_sft/model.safetensors",
                "models/agent_rl/step-00002/model.safetensors", "models/agent_rl/merged-teacher/model.safetensors",
                "models/tool_sft/model.safetensors", "models/tool_rl/step-00002/model.safetensors"):
        assert (proj / rel).exists(), rel
    # every checkpoint and the discriminator say what made them (protege.json)
    for rel, stage, key in (("models/sft", "sft", "sft"), ("models/rl/step-00002", "rl", "rl"),
                            ("models/merged", "merge", "merge"), ("models/discriminator", "disc_pretrain",
                                                                 "disc_pretrain"),
                            ("models/agent_rl/merged-teacher", "agent_rl", "agent")):
        record = json.loads((proj / rel / "protege.json").read_text())
        assert record["stage"] == stage and key in record["params"] and record["code"]["protege"], rel
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    rl_inputs = json.loads((proj / "models/rl/step-00002/protege.json").read_text())["inputs"]
    assert rl_inputs["models/sft"] == next(o["md5"] for o in lock["sft"]["outs"] if o["path"] == "models/sft")
    agent = json.loads((proj / "reports/agent/summary.json").read_text())
    for point in ("start", "end", "merged_teacher"):
        assert agent[point]["episodes"] == 4 and 0 <= agent[point]["success_rate"] <= 1, point
    assert pd.read_csv(proj / "reports/agent/train_curve.csv")["step"].tolist() == [1, 2]
    tool = json.loads((proj / "reports/tool/summary.json").read_text())
    for point in ("start", "end"):
        assert tool[point]["episodes"] == 4 and {"accuracy", "runtime_error_rate", "tool_calls_per_episode"} <= set(tool[point])
    assert pd.read_csv(proj / "reports/tool/train_curve.csv")["step"].tolist() == [1, 2]
    for stage in ("rl", "rl_baseline"):
        curve = pd.read_csv(proj / "reports" / stage / "learning_curve.csv")
        assert curve["step"].tolist() == [0, 1, 2] and curve["accuracy"].between(0, 1).all(), stage
    curation = json.loads((proj / "reports/curation.json").read_text())
    assert curation["kept"] == 8 and curation["dropped"]["not_selected"] == 4 and curation["rule"] == "softmax"
    report = json.loads((proj / "reports/eval.json").read_text())
    assert list(report["models"]) == ["sft", "rl_final", "merged", "dr_grpo_final"]
    merged = report["models"]["merged"]
    assert len(merged["benchmarks"]) == 14 and merged["world_test"]["items"] == 16
    lo, hi = merged["world_test"]["ci"]
    assert lo <= merged["world_test"]["accuracy"] <= hi
    for kind, k in merged["world_test"]["per_kind"].items():
        assert set(k) >= {"accuracy", "best_constant", "distinct_answers", "n"} and k["n"] > 0, kind
    assert list(report["differences"]) == ["rl_final - sft", "merged - sft", "rl_final - dr_grpo_final"]
    d = report["differences"]["rl_final - sft"]
    assert d["world_test"]["n"] == 16 and d["average"]["benchmarks"] == 14
    assert d["world_test"]["ci"][0] <= d["world_test"]["diff"] <= d["world_test"]["ci"][1]
    for name, b in merged["benchmarks"].items():
        assert b["ci"][0] <= b["score"] <= b["ci"][1], name
    md = (proj / "reports/eval.md").read_text()
    assert report["score"] == merged["average"] and "| **average** |" in md and "**rl_final - sft**:" in md

    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=proj, env=project_env(proj),
                            capture_output=True, text=True, check=True)
    assert "up to date" in status.stdout, status.stdout
    # the stages these start run under a warm stage host, as the pipeline flow runs them (protege/stage_host.py)
    with stage_host.running():
        push_then_pull_into_a_fresh_clone(proj, tmp_path)
        two_experiments_in_a_git_copy(proj, tmp_path)

    client = mlflow_client(proj)
    exp = client.get_experiment_by_name("protege")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("protege.pipeline") == "true"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {"merged.average", "merged.world_test.accuracy"} <= set(parents[0].data.metrics)
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert set(children) == {"world", "mini_benchmarks", "validate", "curate", "teachers", "sft", "rollouts",
                             "disc_pretrain", "rl", "rl_baseline", "merge", "agent_sft", "agent_rl", "tool_sft",
                             "tool_rl", "evaluate", "promote"}
    agent_metrics = client.get_run(children["agent_rl"].info.run_id).data.metrics
    assert {"success_rate", "format_error_rate", "entropy", "kl_merged", "merge_s", "start.success_rate",
            "end.success_rate"} <= set(agent_metrics)
    tool_metrics = client.get_run(children["tool_rl"].info.run_id).data.metrics
    assert {"accuracy", "tool_calls_per_episode", "runtime_error_rate", "shaping_reward_mean", "turns_per_episode",
            "start.accuracy", "end.runtime_error_rate"} <= set(tool_metrics)
    assert [m.step for m in client.get_metric_history(children["rl"].info.run_id, "val_accuracy")] == [0, 1, 2]
    sft_loss = client.get_metric_history(children["sft"].info.run_id, "loss")
    assert [m.step for m in sft_loss] == [2, 4]
    assert children["sft"].inputs.dataset_inputs, "sft logged no input dataset"
    champion = client.get_model_version_by_alias("protege-student", "champion")
    assert str(champion.version) == "1"
    assert sorted(champion.aliases) == ["challenger", "champion"]  # a new version is the challenger, the first wins
    lineage_reaches_the_world_data(proj, champion, {name: r.info.run_id for name, r in children.items()})

    # a second run has nothing to do, and a changed rl param re-runs only rl and what follows it
    params = proj / "params.yaml"
    params.write_text(tiny_params(save_every=2))
    dry = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=proj, env=project_env(proj),
                         capture_output=True, text=True, check=True).stdout
    changed = {line.rstrip(":").strip() for line in dry.splitlines() if line and not line.startswith((" ", "\t"))}
    assert changed == {"rl", "rl_baseline"}, dry  # stages whose own inputs changed; downstream follows


def lineage_reaches_the_world_data(proj: Path, version, runs: dict[str, str]) -> None:
    """`protege lineage --json` walks from the merged checkpoint to the world's data, with dvc.lock's hashes,
    nothing changed since; the version's tags name the runs of the checkpoint and of its parent."""
    proc = subprocess.run([str(Path(sys.executable).parent / "protege"), "lineage",
                           "models:/protege-student@champion", "--json", "--project", str(proj)],
                          env=project_env(proj), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    hashes = {e["path"]: e["md5"] for st in lock.values() for e in st.get("deps", []) + st.get("outs", [])}
    assert report["checkpoint"]["path"] == "models/merged" and report["checkpoint"]["stage"] == "merge"
    assert report["checkpoint"]["md5"] == report["checkpoint"]["current"] == hashes["models/merged"]
    assert [s["stage"] for s in report["stages"]][:2] == ["merge", "rl"] and "world" in [
        s["stage"] for s in report["stages"]]
    assert {s["stage"]: s["run_id"] for s in report["stages"]} == {s["stage"]: runs[s["stage"]]
                                                                   for s in report["stages"]}
    world = [s for s in report["sources"] if s["path"].startswith("data/world")]
    assert {"data/world/train.parquet", "data/world/images/train"} <= {s["path"] for s in world}, world
    for s in world:
        assert s["md5"] == s["current"] == hashes[s["path"]] and s["from"] == ["world"], s
    assert report["mismatches"] == [] and report["teacher_index_sha256"] != "absent"
    tags = version.tags
    assert tags["protege.lineage.run"] == runs["merge"] and tags["protege.lineage.parent.models/rl"] == runs["rl"]
    assert tags["protege.lineage.data.data/teachers"] == hashes["data/teachers"]
    assert tags["protege.lineage.data.data/world/train.parquet"] == hashes["data/world/train.parquet"]
    assert tags["protege.lineage.git_commit"] == "none"  # `dvc init --no-scm`: no git repository


def dvc(proj: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=proj, env=project_env(proj), capture_output=True,
                          text=True, check=True).stdout


def push_then_pull_into_a_fresh_clone(proj: Path, tmp_path: Path) -> None:
    """`dvc push` to a folder remote, then a fresh clone (what git holds: code, dvc.yaml, dvc.lock, params,
    data/pool.dvc and the uncached reports) runs `dvc pull` and has every output back, byte for byte."""
    remote = tmp_path / "remote"
    dvc(proj, "remote", "add", "-d", "local", str(remote))
    dvc(proj, "push")
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    outs = {o["path"]: o.get("md5") for st in lock.values() for o in st.get("outs", [])}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for rel in ("dvc.yaml", "dvc.lock", "params.yaml", "data/pool.dvc"):  # data/pool.dvc: the versioned pool
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(proj / rel, fresh / rel)
    shutil.copytree(proj / "protege", fresh / "protege")
    uncached = []
    for st in yaml.safe_load((proj / "dvc.yaml").read_text())["stages"].values():
        for entry in st.get("outs", []) + st.get("metrics", []) + st.get("plots", []):
            if isinstance(entry, dict):
                (path, opts), = entry.items()
                if (opts or {}).get("cache") is False:
                    uncached.append(path)
    for rel in uncached:  # what git would hold
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        if (proj / rel).is_dir():
            shutil.copytree(proj / rel, fresh / rel)
        elif (proj / rel).exists():
            shutil.copy(proj / rel, fresh / rel)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=fresh, check=True,
                   env=project_env(fresh))
    dvc(fresh, "remote", "add", "-d", "local", str(remote))
    dvc(fresh, "pull")
    for rel in outs:
        assert (fresh / rel).exists(), rel
    for rel in ("models/merged/model.safetensors", "data/world/train.parquet", "data/teacher_answers.parquet"):
        assert (fresh / rel).read_bytes() == (proj / rel).read_bytes(), rel
    assert "up to date" in dvc(fresh, "status")
    resumes_in(fresh)


def resumes_in(clone: Path) -> None:
    """A finished rl run resumes in a re-cloned project, whose files all have new mtimes: one more step is
    one more checkpoint, not a restart from step 0."""
    params = yaml.safe_load((clone / "params.yaml").read_text())
    done = params["rl"]["steps"]
    params["rl"]["steps"] = done + 1
    (clone / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run([str(Path(sys.executable).parent / "protege"), "stage", "rl"], cwd=clone,
                          env=project_env(clone), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resuming after step {done}" in proc.stdout + proc.stderr
    summary = json.loads((clone / "reports/stages/rl.json").read_text())
    assert summary["resumed_after_step"] == done
    assert (clone / f"models/rl/step-{done + 1:05d}/model.safetensors").exists()


def cached_outs(proj: Path) -> list[str]:
    found = []
    for st in yaml.safe_load((proj / "dvc.yaml").read_text())["stages"].values():
        for entry in st.get("outs", []) + st.get("metrics", []) + st.get("plots", []):
            path, opts = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
            if (opts or {}).get("cache") is not False:
                found.append(path)
    return found


def two_experiments_in_a_git_copy(proj: Path, tmp_path: Path) -> None:
    """`dvc exp run -S` needs a git repository: a copy of the finished project under git runs two
    configurations of rl.lr (the rl stage), and `dvc exp show` lists both with their params and its metrics."""
    exp = tmp_path / "exp"
    shutil.copytree(proj, exp)
    config = exp / ".dvc" / "config"
    config.write_text("".join(line for line in config.read_text().splitlines(keepends=True) if "no_scm" not in line))
    ignored = ["/mlflow.db", "/mlartifacts/", "/.prefect/"] + [f"/{p}" for p in cached_outs(exp)]
    (exp / ".gitignore").write_text("\n".join(ignored) + "\n")
    git = ["git", "-c", "user.name=protege-test", "-c", "user.email=test@protege.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "finished tiny pipeline"]):
        subprocess.run(git + args, cwd=exp, check=True, capture_output=True)
    for name, lr in (("lr-low", "0.0005"), ("lr-high", "0.01")):
        dvc(exp, "exp", "run", "-S", f"rl.lr={lr}", "-n", name, "rl")  # rl only: what a sweep of rl.lr compares
    shown = json.loads(dvc(exp, "exp", "show", "--json"))
    revs = {r["name"]: r["data"] for c in shown for e in (c.get("experiments") or []) for r in e["revs"]}
    assert {"lr-low", "lr-high"} <= set(revs), list(revs)
    assert revs["lr-low"]["params"]["params.yaml"]["data"]["rl"]["lr"] == 0.0005
    assert revs["lr-high"]["params"]["params.yaml"]["data"]["rl"]["lr"] == 0.01
    assert "reports/stages/rl.json" in revs["lr-high"]["metrics"]


# The service test retrains from this file's finished project after the test above has checked it: defined in
# service_retrain.py, collected here, so the two run in this order in one test process (make test distributes
# whole files: --dist loadfile).
from tests.flows.service_retrain import test_retrain_deployment_on_a_local_service  # noqa: E402,F401
