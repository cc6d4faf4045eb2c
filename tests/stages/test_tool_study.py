"""A tool study (`task: tool`) on a tiny project: GRPO vs GTPO from one shared warm start (models/tool_sft),
2 seeds, the report with accuracy and runtime-error rate at start and end with CIs; the study file's
tool-specific checks; and the direction of a lower-is-better claim on hand-made results."""
import json

import pytest
import yaml

from protege.config import Config, ConfigError
from tests.conftest import REPO

TOOL = {"sft": {"episodes": 8, "steps": 4, "batch_size": 4},
        "rl": {"steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 24, "save_every": 1},
        "eval_episodes": 4, "eval_batch": 4}

STUDY = """
task: tool
seeds: [0, 1]
baseline: grpo
bootstrap: 200
variants:
  warm_start: {train: false}
  grpo: {tool.rl.algorithm: grpo}
  gtpo_g0.5: {tool: {rl: {algorithm: gtpo, gtpo: {gamma: 0.5}}}}
claims:
  - {better: gtpo_g0.5, than: grpo}
  - {better: gtpo_g0.5, than: grpo, metric: runtime_errors}
  - {better: gtpo_g0.5, than: grpo, metric: tool_calls}
"""


class NoTracking:
    def __getattr__(self, name):
        return lambda *a, **k: ""


def _params() -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["world"].update({"n_train": 16, "n_rl": 4, "n_val": 4, "n_test": 4})
    for key, value in TOOL.items():
        if isinstance(value, dict):
            params["tool"][key].update(value)
        else:
            params["tool"][key] = value
    return params


@pytest.fixture(scope="module")
def bare_project(tmp_path_factory):
    """params.yaml and the study file, no artifacts: enough to load and check the study."""
    proj = tmp_path_factory.mktemp("tool_study_bare")
    (proj / "params.yaml").write_text(yaml.safe_dump(_params()))
    (proj / "study.yaml").write_text(STUDY)
    return proj


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    import torch

    from protege.stages import stage_module
    from protege.tools.sandbox import SandboxUnavailable

    torch.set_num_threads(1)
    proj = tmp_path_factory.mktemp("tool_study")
    params = _params()
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    cfg = Config.model_validate(params)
    stage_module("world").run(cfg, proj, NoTracking())
    try:  # the warm start's solver episodes already run their code in the sandbox
        stage_module("tool_sft").run(cfg, proj, NoTracking())
    except SandboxUnavailable as exc:
        pytest.skip(f"the tool environment's sandbox cannot run here (bubblewrap): {exc}")
    (proj / "study.yaml").write_text(STUDY)
    return proj


def test_tool_study_reports_accuracy_and_runtime_errors_with_cis(project, monkeypatch):
    from protege.study.runner import plan, run_study
    from protege.study.spec import load_study

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    study = load_study(project / "study.yaml", project)
    assert study.task == "tool" and [r.key for r in study.runs()][:2] == ["warm_start/seed-0", "grpo/seed-0"]
    paths = run_study(study, isolated=False)
    report = json.loads(paths["json"].read_text())
    assert report["task"] == "tool" and report["end"] == "end"
    for name in ("grpo", "gtpo_g0.5"):
        m = report["variants"][name]["metrics"]
        for key in ("accuracy.start", "accuracy.end", "runtime_errors.start", "runtime_errors.end",
                    "tool_calls.end", "entropy.end"):
            assert m[key]["ci"][0] <= m[key]["mean"] <= m[key]["ci"][1] and m[key]["seeds"] == 2, (name, key)
        assert 0 <= m["accuracy.end"]["mean"] <= 100 and 0 <= m["runtime_errors.end"]["mean"] <= 100
        assert 0 <= m["tool_calls.end"]["mean"] <= study.variants[name].config.tool.task.max_tool_calls
        assert report["variants"][name]["train_rollouts"]["success_rate_last_quarter"]["seeds"] == 2
        assert report["variants"][name]["accuracy_by_kind"]["end"]
    # every variant starts from the same warm start, evaluated on the same questions
    assert report["variants"]["grpo"]["metrics"]["accuracy.start"] == \
        report["variants"]["gtpo_g0.5"]["metrics"]["accuracy.start"]
    assert report["variants"]["gtpo_g0.5"]["vs_baseline"]["accuracy"]["pairs"] == [[0, 0], [1, 1]]
    assert set(report["variants"]["warm_start"]["vs_baseline"]) == {"accuracy", "runtime_errors", "tool_calls",
                                                                    "entropy"}
    claims = report["claims"]
    assert [c["metric"] for c in claims] == ["accuracy", "runtime_errors", "tool_calls"]
    assert [c["difference"] for c in claims] == ["gtpo_g0.5 - grpo", "grpo - gtpo_g0.5", "gtpo_g0.5 - grpo"]
    assert all(c["verdict"] in ("reproduced", "not reproduced", "inconclusive") for c in claims)
    # lower is better: the claim's difference is the baseline's runtime-error rate minus the variant's
    rt = report["variants"]["gtpo_g0.5"]["vs_baseline"]["runtime_errors"]["diff"]
    assert claims[1]["diff"] == pytest.approx(-rt)
    md = paths["md"].read_text()
    assert "# Tool study" in md and "| grpo (baseline) |" in md and "models/tool_sft" in md
    assert "accuracy" in md and "runtime-error rate" in md and paths["png"].stat().st_size > 1000
    for p in plan(study):
        result = json.loads((p.folder / "result.json").read_text())
        assert not (p.folder / "models/tool_rl").exists()  # results only
        ev = result["tool"]["end" if p.run.train else "start"]
        assert len(ev["per_episode"]) == 4 and {"tool_calls", "runtime_errors", "kind"} <= set(ev["per_episode"][0])


@pytest.mark.parametrize("change, message", [
    ({"variants": {"grpo": {"tool.sft.steps": 5}}}, "variants.grpo.tool.sft.steps is not allowed: a tool study shares "
                                                     "its warm start (models/tool_sft)"),
    ({"variants": {"grpo": {"tool.task.max_tool_calls": 3}}}, "variants.grpo.tool.task.max_tool_calls is not allowed"),
    ({"variants": {"grpo": {"agent.rl.lr": 0.1}}}, "variants.grpo.agent.rl.lr is not allowed: a tool study shares"),
    ({"variants": {"grpo": {"rl.lr": 0.1}}}, "variants.grpo.rl.lr is not allowed: a tool study shares"),
    ({"claims": [{"better": "gtpo_g0.5", "than": "grpo", "metric": "success"}]}, "not a tool study's metric"),
    ({"claims": [{"better": "gtpo_g0.5", "than": "grpo", "metric": "world_test"}]}, "not a tool study's metric"),
    ({"variants": {"warm_start": {"train": False, "tool.rl.lr": 0.1}}}, "has no effect"),
    ({"variants": {"grpo": {"tool.rl.algorithm": "reinforce"}}}, "variants.grpo.tool.rl.algorithm"),
])
def test_tool_study_file_errors(bare_project, tmp_path, change, message):
    from protege.study.spec import load_study

    doc = yaml.safe_load(STUDY)
    for key, value in change.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        load_study(path, bare_project)


def test_tool_study_defaults_and_the_gtpo_study_file(bare_project):
    from protege.study.spec import load_study

    study = load_study(bare_project / "study.yaml", bare_project)
    assert study.claims[0].metric == "accuracy"
    assert study.variants["gtpo_g0.5"].config.tool.rl.gtpo.gamma == 0.5
    gtpo = load_study(REPO / "studies/gtpo.yaml", bare_project)
    assert gtpo.task == "tool" and gtpo.baseline == "grpo" and len(gtpo.runs()) == 1 + 8 * 3
    scopes = {name: v.config.tool.rl.gtpo.scope for name, v in gtpo.variants.items()}
    assert scopes["gtpo_g0.9"] == "turn" and scopes["gtpo_g0.9_group"] == "group" and scopes["gtpo_g0.9_batch"] == "batch"
    assert gtpo.variants["gtpo_g1.0_noshape"].config.tool.rl.gtpo.shaping_alpha == 0
    assert {c.metric for c in gtpo.claims} == {"accuracy", "runtime_errors"}


def test_missing_tool_warm_start_says_what_to_run(bare_project):
    from protege.errors import UserFacingError
    from protege.study.runner import check_upstream
    from protege.study.spec import load_study

    with pytest.raises(UserFacingError, match=r"models/tool_sft is missing .*dvc repro tool_sft"):
        check_upstream(load_study(bare_project / "study.yaml", bare_project))


def test_tool_warm_start_fingerprints_tool_studies_only(tmp_path):
    from protege.study.runner import upstream_digest

    before = {task: upstream_digest(tmp_path, task) for task in ("qa", "agent", "tool")}
    (tmp_path / "models/tool_sft").mkdir(parents=True)
    (tmp_path / "models/tool_sft/model.safetensors").write_bytes(b"weights")
    after = {task: upstream_digest(tmp_path, task) for task in ("qa", "agent", "tool")}
    assert after["qa"] == before["qa"] and after["agent"] == before["agent"] and after["tool"] != before["tool"]


def _evaluation(errors: list[int], success: list[bool]) -> dict:
    rows = [{"seed": 1000 + i, "success": s, "turns": 2, "return": 0.0, "format_errors": 0, "entropy": 1.0,
             "tool_calls": 1, "runtime_errors": e, "kind": "count"} for i, (e, s) in enumerate(zip(errors, success))]
    n = len(rows)
    return {"episodes": n, "success_rate": sum(success) / n, "success_ci": [0, 1], "format_error_rate": 0.0,
            "turns_per_episode": 2.0, "entropy": 1.0, "accuracy": sum(success) / n, "tool_calls_per_episode": 1.0,
            "runtime_error_rate": sum(e > 0 for e in errors) / n, "runtime_errors_per_call": sum(errors) / n,
            "accuracy_by_kind": {"count": sum(success) / n}, "per_episode": rows}


def test_fewer_runtime_errors_reproduces_the_claim(bare_project):
    """A variant with fewer runtime errors (and more right answers) than the baseline reproduces both claims."""
    from protege.study.report import build_report, markdown
    from protege.study.outcomes import model_result
    from protege.study.spec import load_study

    study = load_study(bare_project / "study.yaml", bare_project)
    start = _evaluation([1] * 20, [False] * 20)
    ends = {"grpo": _evaluation([1] * 16 + [0] * 4, [False] * 16 + [True] * 4),
            "gtpo_g0.5": _evaluation([1] * 2 + [0] * 18, [False] * 4 + [True] * 16)}
    results = {"warm_start/seed-0": {"train": False, "tool": {"start": start}}}
    for name, end in ends.items():
        for seed in study.seeds:
            results[f"{name}/seed-{seed}"] = {"train": True, "tool": {"start": start, "end": end}}
    assert model_result(results["grpo/seed-0"], "rl_final") is ends["grpo"]
    assert model_result(results["grpo/seed-0"], "merged") is start  # no merged teacher: the warm start
    report = build_report(study, results, [])
    acc, errors, calls = report["claims"]
    assert acc["verdict"] == "reproduced" and acc["diff"] == pytest.approx(60)
    assert errors["verdict"] == "reproduced" and errors["diff"] == pytest.approx(70)
    assert calls["verdict"] == "inconclusive" and calls["diff"] == pytest.approx(0)
    assert report["variants"]["gtpo_g0.5"]["vs_baseline"]["runtime_errors"]["diff"] == pytest.approx(-70)
    assert report["variants"]["warm_start"]["metrics"]["runtime_errors.start"]["mean"] == pytest.approx(100)
    md = markdown(report)
    assert "runtime-error rate, lower is better; grpo - gtpo_g0.5): **reproduced**, +70.0" in md
    assert "models/tool_sft" in md and "held-out questions" in md


SUITE = """
name: both
seeds: [0]
bootstrap: 200
report: reports/results.md
parts:
  first:
    task: tool
    baseline: grpo
    variants:
      warm_start: {train: false}
      grpo: {tool.rl.algorithm: grpo}
    claims:
      - {name: "GRPO beats its warm start", better: grpo, than: warm_start}
  second:
    task: tool
    baseline: gtpo
    variants:
      gtpo: {tool.rl.algorithm: gtpo}
      gtpo_g0.5: {tool.rl.algorithm: gtpo, tool.rl.gtpo.gamma: 0.5}
    claims:
      - {name: "gamma 0.9 at least as good as 0.5", better: gtpo, than: gtpo_g0.5, margin: 5.0}
"""


def test_a_file_with_parts_runs_in_one_queue_and_tabulates_every_claim(project, monkeypatch):
    from typer.testing import CliRunner

    from protege.cli import app
    from protege.study.runner import plan, run_study
    from protege.study.spec import load_suite

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (project / "suite.yaml").write_text(SUITE)
    suite = load_suite(project / "suite.yaml", project)
    paths = run_study(suite, isolated=False)
    assert paths["md"] == project / "reports/results.md"
    md = paths["md"].read_text()
    table = [line for line in md.splitlines() if line.startswith("| first |") or line.startswith("| second |")]
    assert len(table) == 2 and "GRPO beats its warm start" in table[0] and "`gtpo` >= `gtpo_g0.5`, margin 5)" in table[1]
    assert all(any(v in line for v in ("**reproduced**", "**not reproduced**", "**inconclusive**")) for line in table)
    assert "## second: tool study `both.second`" in md and "accuracy" in md
    # the parts' training curves as pictures beside the file's report, shown by it
    assert "![collapse curves of `both.first`](results.first.collapse.png)" in md
    assert (project / "reports/results.first.collapse.png").stat().st_size > 1000
    combined = json.loads((project / "reports/study/both.json").read_text())
    assert set(combined["parts"]) == {"first", "second"}
    claim = combined["parts"]["second"]["claims"][0]
    lo = claim["ci"][0]
    assert claim["margin"] == 5.0 and claim["verdict"] == ("reproduced" if lo > -5 else
                                                             "not reproduced" if claim["ci"][1] < -5 else "inconclusive")
    for study in suite.studies:  # each part keeps its own report and run folders
        assert (project / f"reports/study/{study.name}.md").exists()
        assert all(p.finished for p in plan(study))
    # nothing left to run: the CLI rewrites the reports without starting a flow
    paths["md"].unlink()
    monkeypatch.chdir(project)
    res = CliRunner().invoke(app, ["study", "suite.yaml", "--project", str(project)])
    assert res.exit_code == 0, res.output
    assert paths["md"].read_text() == md and not (project / ".prefect").exists()
