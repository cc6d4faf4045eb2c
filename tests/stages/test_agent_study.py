"""An agent study (`task: agent`) on a tiny project: plain RL vs GTR-Turbo from one shared warm start,
2 seeds, the report with CIs at start and end, and the study file's agent-specific checks."""
import json

import pytest
import yaml

from protege.config import Config, ConfigError
from tests.conftest import REPO

AGENT = {"grid": {"max_turns": 2}, "sft": {"episodes": 8, "steps": 2, "batch_size": 4},
         "rl": {"steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6, "save_every": 1,
                "ppo": {"value_warmup_steps": 1}},
         "eval_episodes": 6, "eval_batch": 6}

STUDY = """
task: agent
seeds: [0, 1]
baseline: plain
bootstrap: 200
common: {agent.rl.eval_every: 1, agent.rl.eval_episodes: 3}
variants:
  warm_start: {train: false}
  plain: {agent.rl.gtr.guidance: none}
  gtr_kl: {agent: {rl: {gtr: {guidance: kl, merge: ema}}}}
preconditions:
  - {name: collapses, variant: plain, metric: distinct_thoughts_per_state, kind: collapse, ratio: 0.5}
  - {name: teacher_leads, variant: gtr_kl, metric: teacher_eval_success, than: eval_success,
     kind: at_least_part_of_run}
claims:
  - {better: gtr_kl, than: plain, requires: [collapses, teacher_leads]}
  - {better: gtr_kl, than: plain, metric: entropy}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    import torch

    from protege.stages import stage_module
    from protege.stages.common import QuietRun

    torch.set_num_threads(1)
    proj = tmp_path_factory.mktemp("agent_study")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["world"].update({"n_train": 16, "n_rl": 4, "n_val": 4, "n_test": 4})
    for key, value in AGENT.items():
        if isinstance(value, dict):
            params["agent"][key].update(value)
        else:
            params["agent"][key] = value
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    cfg = Config.model_validate(params)
    for stage in ("world", "agent_sft"):
        stage_module(stage).run(cfg, proj, QuietRun())
    (proj / "study.yaml").write_text(STUDY)
    return proj


def test_agent_study_reports_start_and_end_with_cis(project, monkeypatch):
    from protege.study.runner import plan, run_study
    from protege.study.spec import load_study

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    study = load_study(project / "study.yaml", project)
    assert study.task == "agent" and [r.key for r in study.runs()][:2] == ["warm_start/seed-0", "plain/seed-0"]
    paths = run_study(study, isolated=False)
    report = json.loads(paths["json"].read_text())
    assert report["task"] == "agent" and report["end"] == "end"
    for name in ("plain", "gtr_kl"):
        m = report["variants"][name]["metrics"]
        for key in ("success.start", "success.end", "entropy.start", "entropy.end", "format_errors.end"):
            assert m[key]["ci"][0] <= m[key]["mean"] <= m[key]["ci"][1] and m[key]["seeds"] == 2, (name, key)
        assert 0 <= m["success.end"]["mean"] <= 100 and m["entropy.end"]["mean"] >= 0
        assert report["variants"][name]["train_rollouts"]["success_rate_last_quarter"]["seeds"] == 2
    # every variant starts from the same warm start, evaluated on the same layouts
    assert report["variants"]["plain"]["metrics"]["success.start"] == report["variants"]["gtr_kl"]["metrics"]["success.start"]
    assert report["variants"]["gtr_kl"]["vs_baseline"]["success"]["pairs"] == [[0, 0], [1, 1]]
    assert [c["metric"] for c in report["claims"]] == ["success", "entropy"]
    assert report["claims"][1]["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    # the first claim waits for plain RL's collapse and a leading teacher, measured on both seeds' curves
    statuses = {p["name"]: (p["status"], p["seeds"]) for p in report["preconditions"]}
    assert set(statuses) == {"collapses", "teacher_leads"} and all(n == 2 for _, n in statuses.values())
    met = all(s == "met" for s, _ in statuses.values())
    assert (report["claims"][0]["verdict"] == "precondition not met") != met
    teacher = report["preconditions"][1]["per_seed"]["0"]
    assert teacher["points"] == 2  # the held-out curve at both steps
    assert report["figures"] == ["collapse", "teacher"]
    assert [p[0] for p in report["curves"]["gtr_kl"]["teacher_eval_success"]] == [1, 2]
    md = paths["md"].read_text()
    assert "| plain (baseline) |" in md and "Agent study" in md and paths["png"].stat().st_size > 1000
    assert "## Preconditions" in md and "![collapse curves" in md
    for key in report["figures"]:
        assert paths["md"].with_name(f"{study.name}.{key}.png").stat().st_size > 1000
    for p in plan(study):
        result = json.loads((p.folder / "result.json").read_text())
        assert not (p.folder / "models/agent_rl").exists()  # results only
        ev = result["agent"]["end" if p.run.train else "start"]
        assert len(ev["per_episode"]) == 6
        if p.run.train:
            assert [r["step"] for r in result["curve"]] == [1, 2] and "thought_tokens" in result["curve"][0]
        if p.run.variant == "gtr_kl":
            assert "merged_teacher" in result["agent"]


@pytest.mark.parametrize("change, message", [
    ({"variants": {"plain": {"agent.sft.steps": 5}}}, "variants.plain.agent.sft.steps is not allowed: an agent study shares"),
    ({"variants": {"plain": {"rl.lr": 0.1}}}, "variants.plain.rl.lr is not allowed: an agent study shares"),
    ({"claims": [{"better": "gtr_kl", "than": "plain", "metric": "world_test"}]}, "not an agent study's metric"),
    ({"variants": {"warm_start": {"train": False, "agent.rl.lr": 0.1}}}, "has no effect"),
])
def test_agent_study_file_errors(project, tmp_path, change, message):
    from protege.study.spec import load_study

    doc = yaml.safe_load(STUDY)
    for key, value in change.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_study(path, project)


def test_missing_warm_start_says_what_to_run(project, tmp_path):
    import shutil

    from protege.errors import UserFacingError
    from protege.study.runner import check_upstream
    from protege.study.spec import load_study

    proj = tmp_path / "p"
    proj.mkdir()
    shutil.copy(project / "params.yaml", proj / "params.yaml")
    (proj / "study.yaml").write_text(STUDY)
    with pytest.raises(UserFacingError, match="dvc repro agent_sft"):
        check_upstream(load_study(proj / "study.yaml", proj))


WARM_STUDY = """
name: warm_seeds
task: agent
seeds: [0, 1, 2]
warm_start_seeds: [0, 5]
baseline: plain
bootstrap: 200
variants:
  warm_start: {train: false}
  plain: {agent.rl.steps: 1, agent.rl.ppo.value_warmup_steps: 0}
claims:
  - {better: plain, than: warm_start}
"""


def test_warm_start_seeds_train_their_own_warm_starts_and_pair_every_arm(project, monkeypatch):
    """Seeds 0 and 2 play from warm start 0 (params.yaml's seed: the project's own, linked), seed 1 from warm
    start 5 (trained once in the study's folder); the warm start's evaluation runs once per seed, so every
    difference is paired by seed; a second run trains nothing again."""
    from protege.study import warm_starts
    from protege.study.runner import plan, run_study
    from protege.study.spec import load_study

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (project / "warm.yaml").write_text(WARM_STUDY)
    study = load_study(project / "warm.yaml", project)
    assert [(r.variant, r.seed, r.warm_seed) for r in study.runs()] == [
        ("warm_start", 0, 0), ("plain", 0, 0), ("warm_start", 1, 5), ("plain", 1, 5),
        ("warm_start", 2, 0), ("plain", 2, 0)]  # seed by seed: a study stopped part way has whole seeds
    assert warm_starts.model_dir(study, 0) == project / "models/agent_sft"
    own = warm_starts.model_dir(study, 5)
    assert own == study.out_dir / "warm_starts/seed-5/models/agent_sft" and not own.exists()
    paths = run_study(study, isolated=False)
    assert (own / "config.json").exists() and warm_starts.finished(study, 5)
    runs = {p.run.key: p.folder for p in plan(study)}
    assert (runs["plain/seed-1"] / "models/agent_sft").resolve() == own.resolve()
    assert (runs["plain/seed-2"] / "models/agent_sft").resolve() == (project / "models/agent_sft").resolve()
    report = json.loads(paths["json"].read_text())
    assert report["variants"]["warm_start"]["runs_planned"] == 3
    claim = report["claims"][0]
    assert claim["verdict"] is not None and len(claim["pairs"]) == 3, claim
    stamp = (study.out_dir / "warm_starts/seed-5" / warm_starts.DONE).stat().st_mtime
    assert all(p.finished for p in plan(study))
    run_study(study, isolated=False)
    assert (study.out_dir / "warm_starts/seed-5" / warm_starts.DONE).stat().st_mtime == stamp
