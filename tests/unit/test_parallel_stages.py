"""Stages of independent branches at once: which stage waits for which, and the slots that bound them."""
import contextvars
import threading
import time

import pytest

from protege.pipeline import descendants, run_dag, stage_upstream
from tests.conftest import REPO


def test_upstream_stages_come_from_dvc_yaml():
    from protege.dag import stages_in

    STAGES = stages_in(REPO)  # the world DAG: no data stage
    assert "data" not in STAGES and STAGES[0] == "world"
    up = stage_upstream(REPO, STAGES)
    assert up["world"] == []
    assert up["agent_rl"] == ["agent_sft"] and up["agent_sft"] == ["world"]
    assert up["tool_rl"] == ["tool_sft"]
    assert set(up["rl"]) >= {"sft", "curate", "teachers", "disc_pretrain"}
    assert set(up["evaluate"]) >= {"rl", "merge", "rl_baseline", "mini_benchmarks"}
    # the games never wait for the question chain, nor it for them
    question = {"sft", "curate", "teachers", "rollouts", "disc_pretrain", "rl", "rl_baseline", "merge"}
    assert not question & set(up["agent_rl"] + up["agent_sft"] + up["tool_rl"] + up["tool_sft"])
    # dvc.yaml's order is a topological order
    assert all(STAGES.index(u) < STAGES.index(s) for s in STAGES for u in up[s])


UPSTREAM = {"world": [], "validate": ["world"], "agent_sft": ["world"], "tool_sft": ["world"],
            "sft": ["validate"], "rl": ["sft"], "agent_rl": ["agent_sft"], "evaluate": ["rl"]}


def test_descendants_are_transitive():
    below = descendants(UPSTREAM)
    assert below["world"] == set(UPSTREAM) - {"world"}
    assert below["validate"] == {"sft", "rl", "evaluate"} and below["agent_sft"] == {"agent_rl"}
    assert below["evaluate"] == set()


def test_at_most_jobs_at_once_and_the_longest_chain_first():
    lock = threading.Lock()
    started, live, peak = [], [0], [0]

    def run_one(stage):
        with lock:
            started.append(stage)
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.01 if stage == "validate" else 0.1)  # validate frees its slot first
        with lock:
            live[0] -= 1
        return stage.upper()

    out = run_dag(UPSTREAM, run_one, jobs=2)
    assert out == {s: s.upper() for s in UPSTREAM} and peak[0] == 2
    # after world two slots: validate (3 stages wait below it) and agent_sft (1), not tool_sft (0); the two
    # threads may record their start in either order
    assert started[0] == "world" and set(started[1:3]) == {"validate", "agent_sft"}
    assert started.index("sft") < started.index("tool_sft")  # the question chain keeps a slot
    for stage, ups in UPSTREAM.items():
        assert all(started.index(u) < started.index(stage) for u in ups)


def test_a_failed_stage_stops_its_branch_and_the_others_finish():
    ran = []

    def run_one(stage):
        ran.append(stage)
        if stage == "sft":
            raise RuntimeError("sft broke")
        return stage

    with pytest.raises(RuntimeError, match="sft broke"):
        run_dag(UPSTREAM, run_one, jobs=2)
    assert "rl" not in ran and "evaluate" not in ran
    assert {"agent_sft", "agent_rl", "tool_sft"} <= set(ran)


def test_each_stage_sees_the_callers_context():
    var = contextvars.ContextVar("flow_run", default=None)
    var.set("run-1")
    seen = run_dag({"a": [], "b": [], "c": ["a"]}, lambda stage: var.get(), jobs=2)
    assert seen == {"a": "run-1", "b": "run-1", "c": "run-1"}


def test_with_expected_seconds_the_longest_chain_starts_first():
    from protege.pipeline import bottom_levels

    seconds = {"world": 20, "validate": 7, "sft": 195, "rl": 65, "evaluate": 24, "agent_sft": 216, "agent_rl": 141,
               "tool_sft": 342}
    level = bottom_levels(UPSTREAM, seconds)
    # hand-added: tool_sft alone 342; agent chain 216 + 141 = 357; question chain 7 + 195 + 65 + 24 = 291
    assert level["tool_sft"] == 342 and level["agent_sft"] == 357 and level["validate"] == 291
    assert level["world"] == 20 + 357
    order, lock = [], threading.Lock()

    def run_one(stage):
        with lock:
            order.append(stage)

    run_dag(UPSTREAM, run_one, jobs=1, seconds=seconds)
    # one slot: after world the agent chain's head, then tool_sft, then the question chain (most stages below
    # it would have gone first without the estimates)
    assert order[:4] == ["world", "agent_sft", "tool_sft", "validate"]


def test_expected_seconds_are_the_last_run_here_else_dvc_yaml_hints(tmp_path):
    from protege.pipeline import SECONDS_FILE, _record_seconds, expected_seconds

    (tmp_path / "dvc.yaml").write_text("stages:\n  a:\n    cmd: x\n    meta: {seconds: 30}\n  b:\n    cmd: y\n")
    assert expected_seconds(tmp_path) == {"a": 30.0}
    _record_seconds(tmp_path, "b", 12.34)  # no .dvc folder: not a DVC project, nothing recorded
    assert expected_seconds(tmp_path) == {"a": 30.0}
    (tmp_path / ".dvc").mkdir()
    _record_seconds(tmp_path, "b", 12.34)
    _record_seconds(tmp_path, "a", 41.0)
    assert expected_seconds(tmp_path) == {"a": 41.0, "b": 12.3}
    (tmp_path / SECONDS_FILE).write_text("not json")  # a damaged record: the hints stand
    assert expected_seconds(tmp_path) == {"a": 30.0}
