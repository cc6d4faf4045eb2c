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
    # at least 5 RL seeds over 2 warm starts per compared arm: seeds 1, 3, 5 on one, 2 and 4 on the other; GTR-Turbo
    # on EZPoints takes the reproduced study's first 5 seeds (3-7, not the probe's 1 and 2), alike over its 2
    assert all(len(s.seeds) == 5 and s.warm_start_seeds == [0, 1] for s in suite.studies)
    assert suite.study("ril").seeds == suite.study("gtpo").seeds == [1, 2, 3, 4, 5]
    assert suite.study("gtr_turbo").seeds == [3, 4, 5, 6, 7]
    assert [suite.study("ril").warm_seed(i) for i in (1, 2, 3, 4, 5)] == [0, 1, 0, 1, 0]
    assert [suite.study("gtr_turbo").warm_seed(i) for i in (3, 4, 5, 6, 7)] == [0, 1, 0, 1, 0]
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
    """GTR-Turbo's claims wait for plain PPO's collapse, read from its actions as the EZPoints studies read it,
    and a leading teacher (the curve every 10 steps); RIL's for a discriminator that separates and a similarity
    reward that starts in range."""
    from protege.study.spec import load_suite

    shutil.copy(REPO / "studies/headline.yaml", project / "headline.yaml")
    suite = load_suite(project / "headline.yaml", project)
    gtr, ril = suite.study("gtr_turbo"), suite.study("ril")
    assert gtr.find_run("plain", 3).config.agent.rl.eval_every == 10
    assert gtr.claims[0].requires == ("plain_actions_collapse", "plain_success_falls", "teacher_leads")
    assert [(c.better, c.than, c.metric) for c in gtr.claims] == [("gtr_kl", "plain", "success"),
                                                                  ("gtr_kl", "plain", "format_errors")]
    actions = next(p for p in gtr.preconditions if p.name == "plain_actions_collapse")
    assert (actions.variant, actions.metric, actions.direction, actions.ratio, actions.threshold, actions.window) == \
        ("plain", "format_error_rate", "up", 3.0, 0.3, 5)
    auroc, sim = ril.preconditions
    assert (auroc.metric, auroc.kind, auroc.threshold) == ("disc_pretrain.heldout_auroc", "above", 0.6)
    assert (sim.metric, sim.kind, sim.lo, sim.hi, sim.at) == ("similarity_reward_student", "between", 0.3, 0.7, "first")
    assert all(c.requires == ("disc_separates", "similarity_starts_in_range") for c in ril.claims)
    shutil.copy(REPO / "studies/gtr_turbo.yaml", project / "gtr_turbo.yaml")
    assert len(load_study(project / "gtr_turbo.yaml", project).preconditions) == 6  # the grid study stays


def test_the_headline_gtr_turbo_part_is_the_reproduced_ezpoints_study_on_a_grid_project(project):
    """The headline's GTR-Turbo part plays EZPoints on the demo's grid project (params.yaml untouched): its
    warm starts are trained on the 2-card game, none is the project's grid one, and each of its runs is the run
    of studies/gtr_turbo_ezpoints_format.yaml (the reproduced claim, loaded in a project reconfigured for
    EZPoints) with the same seed, on the same warm-start seed, with the same preconditions."""
    import yaml

    from protege.study import warm_starts
    from protege.study.spec import load_suite

    shutil.copy(REPO / "studies/headline.yaml", project / "headline.yaml")
    gtr = load_suite(project / "headline.yaml", project).study("gtr_turbo")
    assert gtr.game == {"agent.env": "points24", "agent.points24.cards": 2}
    assert yaml.safe_load((project / "params.yaml").read_text())["agent"]["env"] == "grid"
    warm = warm_starts.project_config(gtr, game=True)
    assert (warm.agent.env, warm.agent.points24.cards) == ("points24", 2)
    assert not warm_starts.plays_projects_game(gtr) and not warm_starts.is_projects(gtr, 0)
    assert [warm_starts.model_dir(gtr, w) for w in (0, 1)] == [
        gtr.out_dir / f"warm_starts/seed-{w}/models/agent_sft" for w in (0, 1)]

    ez = project / "ez"
    ez.mkdir()
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["agent"]["env"] = "points24"
    params["agent"]["points24"] = {**(params["agent"].get("points24") or {}), "cards": 2}
    (ez / "params.yaml").write_text(yaml.safe_dump(params))
    shutil.copy(REPO / "studies/gtr_turbo_ezpoints_format.yaml", ez / "fmt.yaml")
    fmt = load_study(ez / "fmt.yaml", ez)
    for seed in gtr.seeds:
        for arm in ("warm_start", "plain", "gtr_kl"):
            ours, theirs = gtr.find_run(arm, seed), fmt.find_run(arm, seed)
            assert ours.config == theirs.config and ours.warm_seed == theirs.warm_seed, (arm, seed)
    assert warm_starts.project_config(fmt, game=True).agent == warm.agent
    assert gtr.preconditions == fmt.preconditions
    assert [c.requires for c in gtr.claims] == [fmt.claims[0].requires, fmt.claims[2].requires]


def test_dry_run_prints_every_parts_game_warm_starts_claims_and_preconditions(project, monkeypatch):
    """`protege study studies/headline.yaml --dry-run`: each part's game, its warm starts (trained or the
    project's) and each claim with the preconditions it requires, their fields as the file fixes them."""
    monkeypatch.chdir(project)
    shutil.copy(REPO / "studies/headline.yaml", project / "headline.yaml")
    res = CliRunner().invoke(app, ["study", "headline.yaml", "--dry-run", "--project", str(project)])
    assert res.exit_code == 0, res.output
    out = res.output
    heads = [out.index(f"part {p} ({t})") for p, t in (("ril", "qa"), ("gtr_turbo", "agent"), ("gtpo", "tool"))]
    assert heads == sorted(heads)
    ril, gtr, gtpo = out[heads[0]:heads[1]], out[heads[1]:heads[2]], out[heads[2]:]
    lines = [line.strip() for line in gtr.splitlines()]
    assert ("game: agent.env=points24 agent.points24.cards=2 (the part's own, over params.yaml's agent.env=grid "
            "agent.points24.cards=4): every run plays it, and its warm starts are trained under it") in lines
    for w in (0, 1):
        assert any(line.startswith(f"warm start {w}: to train: agent_sft under agent.env=points24 "
                                   f"agent.points24.cards=2 into {project}/reports/study/headline.gtr_turbo/"
                                   f"warm_starts/seed-{w}") for line in lines), gtr
    assert "the project's own" not in gtr
    claim = lines.index('claim "GTR-Turbo (kl) > plain PPO on EZPoints": gtr_kl - plain on success (rl_final), '
                        'reproduced when its CI lies above 0')
    assert [line.split(" (")[0] for line in lines[claim + 1:claim + 4]] == [
        "requires plain_actions_collapse", "requires plain_success_falls", "requires teacher_leads"]
    assert lines[claim + 1].startswith("requires plain_actions_collapse (variant plain, metric format_error_rate, "
                                       "kind collapse, direction up, ratio 3, threshold 0.3, window 5): met when "
                                       "format_error_rate rises: end >= 3 x start and >= 0.3")
    assert lines[claim + 2].startswith("requires plain_success_falls (variant plain, metric success_rate, kind "
                                       "collapse, direction down, ratio 0.5, window 5)")
    assert lines[claim + 3].startswith("requires teacher_leads (variant gtr_kl, metric teacher_eval_success, kind "
                                       "at_least_part_of_run, than eval_success, points 1)")
    assert lines[claim + 4].startswith('claim "GTR-Turbo (kl) keeps fewer format errors than plain PPO on EZPoints": '
                                       "plain - gtr_kl on format_errors")
    assert lines[claim + 5].startswith("requires plain_actions_collapse (variant plain")
    assert any(line.startswith("precondition required by no claim (reported): plain_thoughts_collapse (variant "
                               "plain, metric distinct_thoughts_per_state, kind collapse, direction down, ratio 0.5, "
                               "window 5)") for line in lines)
    assert "requires disc_separates (variant ril, metric disc_pretrain.heldout_auroc, kind above, threshold 0.6)" in ril
    assert "requires similarity_starts_in_range (variant ril, metric similarity_reward_student, kind between" in ril
    assert "warm start 0: the project's own (params.yaml seed 0), linked" in ril
    assert 'claim "GTPO >= GRPO": gtpo - grpo on accuracy (rl_final), reproduced when its CI lies above -1; ' \
           "no preconditions" in gtpo
    assert "game: params.yaml's (tool.task.kinds=" in gtpo
    assert not (project / "reports").exists() and not (project / ".prefect").exists()


GAME_STUDY = """
name: cards
task: agent
seeds: [1, 2]
warm_start_seeds: [0, 1]
game: {agent.env: points24, agent.points24: {cards: 2}}
baseline: plain
variants:
  warm_start: {train: false}
  plain: {agent.rl.gtr.guidance: none}
"""


def test_a_game_of_its_own_is_part_of_the_warm_starts_identity(project):
    """A study's `game:` reaches every run and its warm starts: their fingerprint holds it, so a grid warm start
    in the same folder is not finished for the card game (it is trained again), the project's grid warm start
    stands for none of its seeds, and its runs neither read nor depend on the project's models/agent_sft."""
    from protege.errors import UserFacingError
    from protege.study import warm_starts
    from protege.study.runner import check_upstream, plan

    cards = load_study(write(project, GAME_STUDY), project)
    grid = load_study(write(project, GAME_STUDY.replace("game: {agent.env: points24, agent.points24: {cards: 2}}\n",
                                                        ""), "grid.yaml"), project)
    assert cards.name == grid.name == "cards" and grid.game == {}  # the same folders: only the game differs
    assert cards.game == {"agent.env": "points24", "agent.points24.cards": 2}
    assert all(r.config.agent.env == "points24" and r.config.agent.points24.cards == 2 for r in cards.runs())
    assert all(r.config.agent.env == "grid" for r in grid.runs())

    # the project's warm start is params.yaml's seed under params.yaml's game only
    assert warm_starts.is_projects(grid, 0) and not warm_starts.is_projects(cards, 0)
    assert warm_starts.model_dir(grid, 0) == project / "models/agent_sft"
    assert warm_starts.model_dir(cards, 0) == cards.out_dir / "warm_starts/seed-0/models/agent_sft"
    for w in (0, 1):
        assert warm_starts.fingerprint(cards, w) != warm_starts.fingerprint(grid, w)
    # a grid warm start finished in the folder is not the card game's: the card study trains it again
    done = warm_starts.folder(grid, 1)
    (done / "models/agent_sft").mkdir(parents=True)
    (done / warm_starts.DONE).write_text(warm_starts.fingerprint(grid, 1) + "\n")
    assert warm_starts.finished(grid, 1) and not warm_starts.finished(cards, 1)
    assert warm_starts.pending(cards, cards.runs()) == [0, 1] and warm_starts.pending(grid, grid.runs()) == []

    # the card study's runs depend on their own warm starts, not on the project's (grid) models/agent_sft
    before = {p.run.key: p.fingerprint for p in plan(cards)}
    grid_before = {p.run.key: p.fingerprint for p in plan(grid)}
    assert set(before.values()).isdisjoint(grid_before.values())
    (project / "models/agent_sft").mkdir(parents=True)
    (project / "models/agent_sft/config.json").write_text("{}")
    assert {p.run.key: p.fingerprint for p in plan(cards)} == before
    assert {p.run.key: p.fingerprint for p in plan(grid)} != grid_before
    # it needs the base student to train its warm starts, not the project's warm start
    with pytest.raises(UserFacingError, match="models/base is missing.*dvc repro world"):
        check_upstream(cards)
    (project / "models/base").mkdir(parents=True)
    shutil.rmtree(project / "models/agent_sft")
    check_upstream(cards)
    with pytest.raises(UserFacingError, match="dvc repro agent_sft"):
        check_upstream(grid)

    # a game that changes nothing in params.yaml keeps the project's warm start for its seed
    same = load_study(write(project, GAME_STUDY.replace("{agent.env: points24, agent.points24: {cards: 2}}",
                                                        "{agent.env: grid}"), "same.yaml"), project)
    assert warm_starts.plays_projects_game(same) and warm_starts.is_projects(same, 0)


@pytest.mark.parametrize("change, expected", [
    (("task: agent", "task: qa"), "key 'game' applies to agent and tool studies"),
    (("agent.points24: {cards: 2}", "agent.rl.steps: 3"), "game.agent.rl.steps is not allowed: it changes the runs"),
    (("agent.points24: {cards: 2}", "agent.eval_episodes: 3"), "game.agent.eval_episodes is not allowed"),
    (("agent.points24: {cards: 2}", "world.n_train: 3"), "game.world.n_train is not allowed: game holds settings of "
                                                         "the agent section"),
    (("agent.points24: {cards: 2}", "tool.sft.steps: 3"), "game.tool.sft.steps is not allowed"),
    (("agent.env: points24", "agent.env: chess"), "game.agent.env expects"),
    (("agent.points24: {cards: 2}", "agent.points24: {cardz: 2}"), "unknown key 'game.agent.points24.cardz'"),
    (("warm_start_seeds: [0, 1]\n", ""), "key 'game' needs warm_start_seeds"),
    (("game: {", "gmae: {"), "unknown key 'gmae'"),
])
def test_a_bad_game_setting_is_one_line(project, change, expected):
    old, new = change
    assert old in GAME_STUDY
    path = write(project, GAME_STUDY.replace(old, new))
    with pytest.raises(ConfigError) as exc:
        load_study(path, project)
    msg = str(exc.value)
    assert expected in msg and msg.startswith(str(path)) and "\n" not in msg, msg


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
