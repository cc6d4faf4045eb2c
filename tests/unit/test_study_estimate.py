"""The study's expected time: a run's cost scales with its RL work, the rate comes from the finished runs
of the same part, then of the same task, then from the project's own RL stage; lanes share the queue."""
import json

from protege.config import Config
from protege.paths import STAGE_METRICS
from protege.study import estimate
from protege.study.estimate import Finished, describe, run_seconds, stage_rate, wall_seconds, work


def test_work_is_steps_times_rollouts_per_step():
    cfg = Config.model_validate({"rl": {"steps": 10, "questions_per_step": 4, "group_size": 2},
                                 "agent": {"rl": {"ppo": {"value_warmup_steps": 0}, "steps": 5, "seeds_per_step": 3, "group_size": 4}}})
    assert work(cfg, "qa") == 80.0
    assert work(cfg, "agent") == 60.0


def test_the_rate_prefers_the_same_part_then_the_same_task_then_the_stage():
    same_part = Finished("agent", "gtr", True, seconds=100.0, work=50.0)      # 2 s per unit
    other_part = Finished("agent", "other", True, seconds=300.0, work=50.0)   # 6 s per unit
    assert run_seconds("agent", "gtr", True, 10.0, [same_part, other_part], prior_rate=9.0) == 20.0
    assert run_seconds("agent", "new", True, 10.0, [same_part, other_part], prior_rate=9.0) == 40.0  # median 4
    assert run_seconds("agent", "gtr", True, 10.0, [], prior_rate=9.0) == 90.0
    assert run_seconds("agent", "gtr", True, 10.0, [], prior_rate=None) is None
    qa = Finished("qa", None, True, seconds=1000.0, work=10.0)
    assert run_seconds("agent", "gtr", True, 10.0, [qa], prior_rate=None) is None  # another task's rate never


def test_an_evaluation_run_costs_what_finished_ones_did_or_a_twentieth():
    ev = Finished("qa", "ril", False, seconds=7.0, work=10.0)
    trained = Finished("qa", "ril", True, seconds=100.0, work=10.0)
    assert run_seconds("qa", "ril", False, 10.0, [ev, trained], None) == 7.0
    assert run_seconds("qa", "ril", False, 10.0, [trained], None) == 5.0


def test_wall_time_longest_first_over_lanes():
    assert wall_seconds([10, 10, 10, 10], 2) == 20
    assert wall_seconds([30, 10, 10, 10], 2) == 30
    assert wall_seconds([5, 5], 1) == 10


def test_describe_says_what_it_rests_on():
    assert "expected about 1 min" in describe([30.0, 30.0], 1, 0)
    assert "no time estimate yet" in describe([None], 2, 0)
    line = describe([120.0, None], 2, 3)
    assert "3 finished earlier" in line and "for the 1 run(s) with an estimate" in line
    assert describe([3600.0 * 3], 1, 0).endswith("3.0 h")


def test_stage_rate_reads_the_projects_rl_record(tmp_path):
    cfg = Config.model_validate({"agent": {"rl": {"ppo": {"value_warmup_steps": 0}, "steps": 5, "seeds_per_step": 2, "group_size": 2}}})
    assert stage_rate(tmp_path, "agent", cfg) is None
    (tmp_path / STAGE_METRICS).mkdir(parents=True)
    (tmp_path / STAGE_METRICS / "agent_rl.json").write_text(json.dumps({"seconds": 40.0}))
    assert stage_rate(tmp_path, "agent", cfg) == 2.0
    (tmp_path / STAGE_METRICS / "rl.json").write_text("{not json")
    assert stage_rate(tmp_path, "qa", cfg) is None
    assert estimate.RL_STAGE["tool"] == "tool_rl"


def test_a_warm_start_costs_what_the_projects_own_stages_took(tmp_path):
    """The stage JSON's `seconds` first, else the pipeline's record or dvc.yaml's hint; None when a stage
    has neither."""
    stages = ("sft", "curate", "disc_pretrain")
    assert estimate.warm_start_seconds(tmp_path, stages) is None
    (tmp_path / "dvc.yaml").write_text("stages:\n  sft: {cmd: x, meta: {seconds: 100}}\n"
                                       "  curate: {cmd: x, meta: {seconds: 7}}\n"
                                       "  disc_pretrain: {cmd: x, meta: {seconds: 40}}\n")
    assert estimate.warm_start_seconds(tmp_path, stages) == 147.0
    (tmp_path / STAGE_METRICS).mkdir(parents=True)
    (tmp_path / STAGE_METRICS / "sft.json").write_text(json.dumps({"seconds": 20.0, "loss": 1.0}))
    (tmp_path / STAGE_METRICS / "disc_pretrain.json").write_text(json.dumps({"heldout_auroc": 0.7}))  # no seconds
    assert estimate.warm_start_seconds(tmp_path, stages) == 67.0
    assert estimate.warm_start_seconds(tmp_path, ("sft", "teachers")) is None


def test_describe_counts_the_warm_starts_before_the_runs():
    line = describe([60.0, 60.0], 2, 0, warm=[120.0, 120.0])
    assert "after 2 warm start(s) to train" in line and "expected about 5 min (4 min of it warm starts)" in line
    assert "for the 0 warm start(s) with an estimate" in describe([60.0], 1, 0, warm=[None])
    assert "expected about 2 min" in describe([], 1, 3, warm=[120.0])
    assert describe([], 1, 3) == "0 run(s) to do, 3 finished earlier, 1 at a time"


def test_stage_rate_counts_the_work_the_stage_ran_and_refuses_another_games_record(tmp_path):
    """dvc.lock says what the project's RL stage ran with: its work is counted from those params, and a record
    of another game (or output length) than params.yaml's now is no prior at all."""
    cfg = Config.model_validate({"agent": {"env": "points24", "rl": {"ppo": {"value_warmup_steps": 0}, "steps": 5, "seeds_per_step": 2, "group_size": 2}}})
    (tmp_path / STAGE_METRICS).mkdir(parents=True)
    (tmp_path / STAGE_METRICS / "agent_rl.json").write_text(json.dumps({"seconds": 40.0}))
    recorded = cfg.model_dump()["agent"]
    lock = lambda agent: {"schema": "2.0", "stages": {"agent_rl": {"cmd": "x", "params": {"params.yaml": {
        "agent": agent, "seed": 0}}}}}
    (tmp_path / "dvc.lock").write_text(json.dumps(lock({**recorded, "rl": {**recorded["rl"], "steps": 10}})))
    assert stage_rate(tmp_path, "agent", cfg) == 1.0  # 40 s over the 10 x 2 x 2 rollouts it ran, not 5 x 2 x 2
    (tmp_path / "dvc.lock").write_text(json.dumps(lock({**recorded, "env": "grid"})))
    assert stage_rate(tmp_path, "agent", cfg) is None  # a grid run's seconds for a card game
    (tmp_path / "dvc.lock").write_text(json.dumps(lock({**recorded, "rl": {**recorded["rl"], "max_new_tokens": 32}})))
    assert stage_rate(tmp_path, "agent", cfg) is None
    (tmp_path / "dvc.lock").write_text(json.dumps(lock({**recorded, "no_such_key": 1})))  # unreadable: params.yaml's
    assert stage_rate(tmp_path, "agent", cfg) == 2.0
    (tmp_path / "dvc.lock").write_text("stages: [not a mapping")
    assert stage_rate(tmp_path, "agent", cfg) == 2.0


def test_a_grid_stage_record_is_no_prior_for_a_study_that_plays_its_own_card_game(tmp_path):
    """A study part with a game of its own (`game:`, e.g. EZPoints on a grid project) is compared with what the
    project's RL stage played: the grid's seconds scale to grid runs only, not to the part's card-game runs."""
    grid = Config.model_validate({"agent": {"rl": {"ppo": {"value_warmup_steps": 0}, "steps": 5, "seeds_per_step": 2, "group_size": 2}}})
    cards = grid.model_copy(update={"agent": grid.agent.model_copy(update={"env": "points24"})})
    (tmp_path / STAGE_METRICS).mkdir(parents=True)
    (tmp_path / STAGE_METRICS / "agent_rl.json").write_text(json.dumps({"seconds": 40.0}))
    assert stage_rate(tmp_path, "agent", grid) == 2.0
    assert stage_rate(tmp_path, "agent", grid, like=grid) == 2.0
    assert stage_rate(tmp_path, "agent", grid, like=cards) is None
