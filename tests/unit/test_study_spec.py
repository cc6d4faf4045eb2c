"""Study files: overrides validated by the params schema, one-line errors naming file and key, dry run."""
import re
import shutil

import pytest
from typer.testing import CliRunner

from protege.cli import app
from protege.config import ConfigError
from protege.study.spec import load_study
from tests.conftest import REPO

GOOD = """
seeds: [1, 2]
baseline: ril
common: {rl.algorithm: ril}
variants:
  sft: {train: false}
  ril: {}
  dr_grpo: {rl.algorithm: dr_grpo}
  kl0: {rl: {kl_beta: 0}}
claims:
  - {name: RIL beats Dr.GRPO, better: ril, than: dr_grpo, metric: world_test}
  - {better: ril, than: sft}
"""


@pytest.fixture
def project(tmp_path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def write(project, text, name="s.yaml"):
    path = project / name
    path.write_text(text)
    return path


def test_variants_resolve_against_params_yaml(project):
    study = load_study(write(project, GOOD), project)
    assert study.name == "s" and study.seeds == [1, 2] and study.baseline == "ril"
    runs = study.runs()
    # seed by seed, so a study stopped part way has whole seeds to pair; train: false runs once
    assert [r.key for r in runs] == ["sft/seed-1", "ril/seed-1", "dr_grpo/seed-1", "kl0/seed-1",
                                     "ril/seed-2", "dr_grpo/seed-2", "kl0/seed-2"]
    kl0 = study.find_run("kl0", 2)
    assert kl0.config.seed == 2 and kl0.config.rl.kl_beta == 0.0 and kl0.config.rl.algorithm == "ril"
    assert kl0.overrides == {"rl.kl_beta": 0.0}  # resolved values, as the schema reads them
    assert study.find_run("dr_grpo", 1).config.rl.algorithm == "dr_grpo"
    assert study.claims[1].name == "ril > sft" and study.claims[1].metric == "benchmark_average"
    assert study.run_folder(kl0) == project / "reports/study/s/runs/kl0/seed-2"
    assert study.report_paths()["md"] == project / "reports/study/s.md"


@pytest.mark.parametrize("change, expected", [
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {rl: {kl_betta: 0}}"), "unknown key 'variants.kl0.rl.kl_betta'"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {rl.kl_beta: lots}"), "variants.kl0.rl.kl_beta expects float"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {rl.kl_beta: -1}"), "variants.kl0.rl.kl_beta expects float"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {sft.steps: 3}"), "variants.kl0.sft.steps is not allowed: the study shares"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {world: {n_train: 8}}"), "variants.kl0.world.n_train is not allowed"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {seed: 4}"), "variants.kl0.seed is not allowed"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {evaluate.mini_items: 8}"), "variants.kl0.evaluate.mini_items is not allowed"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {rl.teachers: nobody}"), "variants.kl0: rl.teachers is 'nobody'"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {optimizer: adam}"), "unknown key 'variants.kl0.optimizer'"),
    (("kl0: {rl: {kl_beta: 0}}", "kl0: {train: false, rl.lr: 0.1}"), "variants.kl0.rl.lr has no effect"),
    (("common: {rl.algorithm: ril}", "common: {curate.select: 4}"), "common.curate.select is not allowed"),
    (("baseline: ril", "baseline: rill"), "baseline 'rill' is not a variant"),
    (("than: dr_grpo", "than: drgrpo"), "claims[0].than 'drgrpo' is not a variant"),
    (("metric: world_test", "metric: accuracy"), "claims[0].metric 'accuracy' is unknown"),
    (("seeds: [1, 2]", "seeds: []"), "key 'seeds' is empty"),
    (("seeds: [1, 2]", "seeds: [1, 1]"), "key 'seeds' lists a seed twice"),
    (("seeds: [1, 2]", "seedz: [1, 2]"), "unknown key 'seedz'"),
])
def test_bad_study_file_is_one_line_naming_file_and_key(project, change, expected):
    old, new = change
    assert old in GOOD
    path = write(project, GOOD.replace(old, new))
    with pytest.raises(ConfigError) as exc:
        load_study(path, project)
    msg = str(exc.value)
    assert expected in msg and msg.startswith(str(path)) and "\n" not in msg, msg


def test_cli_stops_with_exit_2_before_anything_runs(project, monkeypatch):
    monkeypatch.chdir(project)
    write(project, GOOD.replace("kl_beta: 0", "kl_beta: x"))
    res = CliRunner().invoke(app, ["study", "s.yaml", "--project", str(project)])
    assert res.exit_code == 2
    assert "variants.kl0.rl.kl_beta" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (project / "reports").exists() and not (project / "mlflow.db").exists()


def test_dry_run_lists_runs_without_running(project, monkeypatch):
    monkeypatch.chdir(project)
    write(project, GOOD)
    res = CliRunner().invoke(app, ["study", "s.yaml", "--dry-run", "--project", str(project)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "7 runs, 0 finished, 7 to run" in lines[0] and "every variant: rl.algorithm=ril" in lines[0]
    assert any("kl0" in line and "seed 2" in line and "to run" in line and "rl.kl_beta=0.0" in line for line in lines)
    assert any("sft" in line and "train: false" in line for line in lines)
    assert "make demo" in res.output  # the shared upstream artifacts are missing: said, not run
    assert not (project / "reports").exists() and not (project / ".prefect").exists()


def test_running_without_upstream_artifacts_says_what_to_run(project, monkeypatch):
    monkeypatch.chdir(project)
    write(project, GOOD)
    res = CliRunner().invoke(app, ["study", "s.yaml", "--project", str(project)])
    assert res.exit_code == 1
    assert "data/world/test.parquet" in res.output and "models/sft" in res.output and "make demo" in res.output
    assert not (project / ".prefect").exists()


SUITE = """
name: head
seeds: [1, 2]
report: reports/results.md
parts:
  ril:
    baseline: ril
    variants:
      sft: {train: false}
      ril: {rl.algorithm: ril}
    claims:
      - {better: ril, than: sft, metric: world_test}
  tool:
    task: tool
    seeds: [5]
    baseline: grpo
    variants:
      grpo: {tool.rl.algorithm: grpo}
      gtpo: {tool.rl.algorithm: gtpo}
    claims:
      - {better: gtpo, than: grpo, margin: 1.5}
"""


def test_a_file_with_parts_is_one_study_per_part(project):
    from protege.study.spec import load_suite

    suite = load_suite(write(project, SUITE), project)
    ril, tool = suite.studies
    assert suite.name == "head" and suite.has_parts and [s.part for s in suite.studies] == ["ril", "tool"]
    assert ril.name == "head.ril" and ril.seeds == [1, 2] and ril.task == "qa"
    assert tool.seeds == [5] and tool.task == "tool"  # a part's own seeds win over the file's
    assert tool.claims[0].margin == 1.5 and tool.claims[0].name == "gtpo >= grpo" and tool.claims[0].metric == "accuracy"
    assert ril.run_folder(ril.find_run("ril", 2)) == project / "reports/study/head.ril/runs/ril/seed-2"
    assert suite.report_paths()["md"] == project / "reports/results.md"
    assert load_study(project / "s.yaml", project, "tool").find_run("gtpo", 5).config.tool.rl.algorithm == "gtpo"
    with pytest.raises(ConfigError, match="holds parts \\(ril, tool\\)"):
        load_study(project / "s.yaml", project)
    with pytest.raises(ConfigError, match="no part 'agent'"):
        load_study(project / "s.yaml", project, "agent")


@pytest.mark.parametrize("change, expected", [
    (("report: reports/results.md", "colour: red"), "s.yaml: unknown key 'colour' (allowed next to parts"),
    (("report: reports/results.md", "report: /tmp/r.md"), "s.yaml: key 'report': expected a .md path"),
    (("ril: {rl.algorithm: ril}", "ril: {rl.algorithmm: ril}"), "s.yaml parts.ril: unknown key 'variants.ril.rl.algorithmm'"),
    (("gtpo: {tool.rl.algorithm: gtpo}", "gtpo: {rl.steps: 3}"), "s.yaml parts.tool: variants.gtpo.rl.steps is not allowed"),
    (("margin: 1.5", "margin: -1"), "s.yaml parts.tool: key 'claims.0.margin'"),
    (("than: sft", "than: nobody"), "s.yaml parts.ril: claims[0].than 'nobody' is not a variant"),
    (("  tool:\n    task: tool", "  tool:\n    name: x\n    task: tool"), "s.yaml: parts.tool.name is not allowed"),
])
def test_bad_key_in_a_file_with_parts_is_one_line(project, change, expected):
    from protege.study.spec import load_suite

    old, new = change
    assert old in SUITE
    path = write(project, SUITE.replace(old, new))
    with pytest.raises(ConfigError) as exc:
        load_suite(path, project)
    msg = str(exc.value)
    assert expected in msg and msg.startswith(str(path)) and "\n" not in msg, msg


def test_the_headline_study_file_loads_against_the_project_params(project):
    from protege.study.spec import load_suite

    shutil.copy(REPO / "studies/headline.yaml", project / "headline.yaml")
    suite = load_suite(project / "headline.yaml", project)
    assert [(s.part, s.task) for s in suite.studies] == [("ril", "qa"), ("gtr_turbo", "agent"), ("gtpo", "tool")]
    # at least 5 RL seeds over 2 warm starts per compared arm: seeds 1, 3, 5 on one, 2 and 4 on the other
    assert all(s.seeds == [1, 2, 3, 4, 5] and s.warm_start_seeds == [0, 1] for s in suite.studies)
    assert [suite.study("ril").warm_seed(i) for i in (1, 2, 3, 4, 5)] == [0, 1, 0, 1, 0]
    ril = suite.study("ril")
    visits = ril.find_run("ril", 1).config.rl.steps * ril.find_run("ril", 1).config.rl.questions_per_step
    assert visits == 9600 and suite.report_paths()["md"] == project / "reports/results.md"


def test_a_study_can_require_what_the_warm_start_was_made_with(project):
    """studies/gtr_turbo_points24.yaml needs params.yaml to play the card game (its warm start is the
    project's): it refuses a grid project in one line, and loads once params.yaml says points24."""
    import yaml

    shutil.copy(REPO / "studies/gtr_turbo_points24.yaml", project / "p24.yaml")
    with pytest.raises(ConfigError) as exc:
        load_study(project / "p24.yaml", project)
    msg = str(exc.value)
    assert 'project_params agent.env: "points24", but' in msg and '"grid"' in msg and "dvc repro agent_sft" in msg, msg
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["agent"]["env"] = "points24"
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    study = load_study(project / "p24.yaml", project)
    run = study.find_run("gtr_kl", 1)
    assert run.config.agent.env == "points24" and run.config.agent.rl.gtr.guidance == "kl"
    assert run.config.agent.rl.gtr.kl_coef == 1.0 and run.config.agent.rl.max_new_tokens == 96
    assert study.find_run("plain", 2).config.agent.rl.gtr.guidance == "none"
    bad = (project / "p24.yaml").read_text().replace("project_params: {agent.env: points24}",
                                                  "project_params: {agent.nope: 1}")
    with pytest.raises(ConfigError, match="project_params.agent.nope: no such setting"):
        load_study(write(project, bad), project)


def test_the_ezpoints_study_needs_the_two_card_game_and_reads_collapse_from_the_actions(project):
    """studies/gtr_turbo_ezpoints.yaml: refused while params.yaml plays 4 cards; its seeds are not the probe's
    (1, 2) and its claims wait for plain PPO's invalid actions to rise and its success to fall."""
    import yaml

    shutil.copy(REPO / "studies/gtr_turbo_ezpoints.yaml", project / "ez.yaml")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["agent"]["env"] = "points24"
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match="project_params agent.points24.cards: 2, but"):
        load_study(project / "ez.yaml", project)
    params["agent"]["points24"] = {**(params["agent"].get("points24") or {}), "cards": 2}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    study = load_study(project / "ez.yaml", project)
    assert not {1, 2} & set(study.seeds) and len(study.seeds) == 10 and study.warm_start_seeds == [0, 1]
    run = study.find_run("plain", 3)
    assert run.config.agent.points24.cards == 2 and run.config.agent.rl.steps == 120
    assert study.claims[0].requires == ("plain_actions_collapse", "plain_success_falls", "teacher_leads")
    actions = next(p for p in study.preconditions if p.name == "plain_actions_collapse")
    assert (actions.metric, actions.direction, actions.ratio, actions.threshold) == ("format_error_rate", "up", 3.0, 0.3)


def test_the_ezpoints_code_study_samples_and_scores_as_the_official_code(project):
    """studies/gtr_turbo_ezpoints_code.yaml: RL4VLM's sampling (temperature 0.2, top-k 5, repetition penalty 1.2)
    and one ratio per output in both arms; 5 RL seeds over 2 warm starts, none of them the probe's."""
    import yaml

    shutil.copy(REPO / "studies/gtr_turbo_ezpoints_code.yaml", project / "code.yaml")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["agent"]["env"] = "points24"
    params["agent"]["points24"] = {**(params["agent"].get("points24") or {}), "cards": 2}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    study = load_study(project / "code.yaml", project)
    assert not {1, 2} & set(study.seeds) and len(study.seeds) >= 5 and study.warm_start_seeds == [0, 1]
    for arm in ("plain", "gtr_kl"):
        rl = study.find_run(arm, 4).config.agent.rl
        assert (rl.ppo.objective, rl.temperature, rl.top_k, rl.repetition_penalty, rl.ppo.thought_weight) == \
            ("rl4vlm", 0.2, 5, 1.2, 0.5)
    assert study.claims[0].requires == ("plain_success_falls", "teacher_leads")


def test_the_ezpoints_format_study_adds_the_codes_format_rules_and_a_format_only_control(project):
    """studies/gtr_turbo_ezpoints_format.yaml: the guided arms carry the code's format rules in the game's units
    (+3 / -2, an unparsed turn's KL 100), plain PPO none; the control keeps the format reward without the KL;
    the two earlier EZPoints studies pin the rules off, as they were measured."""
    import yaml

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["agent"]["env"] = "points24"
    params["agent"]["points24"] = {**(params["agent"].get("points24") or {}), "cards": 2}
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    shutil.copy(REPO / "studies/gtr_turbo_ezpoints_format.yaml", project / "fmt.yaml")
    study = load_study(project / "fmt.yaml", project)
    assert study.seeds == list(range(3, 13)) and study.warm_start_seeds == [0, 1]
    gtr = {arm: study.find_run(arm, 3).config.agent.rl.gtr for arm in ("plain", "gtr_kl", "format_only")}
    assert gtr["plain"].guidance == "none"
    assert (gtr["gtr_kl"].guidance, gtr["gtr_kl"].kl_coef, gtr["gtr_kl"].kl_unparsed) == ("kl", 1.0, 100.0)
    assert (gtr["format_only"].guidance, gtr["format_only"].kl_coef) == ("kl", 0.0)
    assert all((g.format_reward, g.format_penalty) == (3.0, -2.0) for g in gtr.values())
    assert [(c.better, c.than) for c in study.claims] == [("gtr_kl", "plain"), ("gtr_kl", "format_only"),
                                                          ("gtr_kl", "plain")]
    for name in ("gtr_turbo_ezpoints", "gtr_turbo_ezpoints_code"):
        shutil.copy(REPO / f"studies/{name}.yaml", project / f"{name}.yaml")
        g = load_study(project / f"{name}.yaml", project).find_run("gtr_kl", 3).config.agent.rl.gtr
        assert (g.kl_unparsed, g.format_reward, g.format_penalty) == (None, 0.0, 0.0)


def test_the_headline_claims_require_their_preconditions(project):
    """GTR-Turbo's claims wait for plain RL's collapse and a leading teacher (the curve every 10 steps);
    RIL's for a discriminator that separates and a similarity reward that starts in range."""
    from protege.study.spec import load_suite

    shutil.copy(REPO / "studies/headline.yaml", project / "headline.yaml")
    suite = load_suite(project / "headline.yaml", project)
    gtr, ril = suite.study("gtr_turbo"), suite.study("ril")
    assert gtr.find_run("plain", 1).config.agent.rl.eval_every == 10
    assert gtr.claims[0].requires == ("plain_thoughts_collapse", "teacher_leads")
    collapse = next(p for p in gtr.preconditions if p.name == "plain_thoughts_collapse")
    assert (collapse.variant, collapse.metric, collapse.ratio, collapse.window) == ("plain", "distinct_thoughts_per_state",
                                                                                   0.5, 5)
    auroc, sim = ril.preconditions
    assert (auroc.metric, auroc.kind, auroc.threshold) == ("disc_pretrain.heldout_auroc", "above", 0.6)
    assert (sim.metric, sim.kind, sim.lo, sim.hi, sim.at) == ("similarity_reward_student", "between", 0.3, 0.7, "first")
    assert all(c.requires == ("disc_separates", "similarity_starts_in_range") for c in ril.claims)
    shutil.copy(REPO / "studies/gtr_turbo.yaml", project / "gtr_turbo.yaml")
    assert len(load_study(project / "gtr_turbo.yaml", project).preconditions) == 6


def test_warm_start_seeds_for_game_and_qa_studies(project):
    body = ("task: agent\nseeds: [1, 2, 3, 4]\nwarm_start_seeds: [0, 7]\nbaseline: plain\n"
            "variants: {base: {train: false}, plain: {}}\n")
    study = load_study(write(project, body), project)
    assert [study.warm_seed(s) for s in (1, 2, 3, 4)] == [0, 7, 0, 7]
    assert [r.seed for r in study.runs() if r.variant == "base"] == [1, 2, 3, 4]
    qa_body = body.replace("task: agent", "task: qa").replace("plain: {}", "plain: {rl.steps: 2}")
    qa = load_study(write(project, qa_body), project)
    assert qa.task == "qa" and qa.warm_start_seeds == [0, 7]
    assert [(r.variant, r.seed, r.warm_seed) for r in qa.runs()] == [
        ("base", 1, 0), ("plain", 1, 0), ("base", 2, 7), ("plain", 2, 7),
        ("base", 3, 0), ("plain", 3, 0), ("base", 4, 7), ("plain", 4, 7)]
    three = load_study(write(project, qa_body.replace("[0, 7]", "[5, 0, 9]")), project)
    assert [three.warm_seed(s) for s in (1, 2, 3, 4)] == [5, 0, 9, 5]
    for text in (body, qa_body):
        for bad, message in [
            (text.replace("[0, 7]", "[3, 3]"), "warm_start_seeds must be distinct seeds >= 0"),
            (text.replace("[0, 7]", "[-1, 2]"), "warm_start_seeds must be distinct seeds >= 0"),
            (text.replace("seeds: [1, 2, 3, 4]", "seeds: [1]"), "2 warm_start_seeds need at least as many seeds"),
            (text.replace("[0, 7]", "[0, x]"), "key 'warm_start_seeds.1'"),
        ]:
            with pytest.raises(ConfigError, match=re.escape(message)):
                load_study(write(project, bad), project)
    plain = load_study(write(project, body.replace("warm_start_seeds: [0, 7]\n", "")), project)
    assert plain.warm_seed(1) is None and [r.seed for r in plain.runs() if r.variant == "base"] == [1]
