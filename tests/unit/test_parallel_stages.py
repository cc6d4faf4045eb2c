"""Stages of independent branches at once: which stage waits for which, and the slots that bound them."""
import contextvars
import threading
import time

import pytest

from protege.pipeline import descendants, run_dag, stage_upstream
from protege.stages import STAGES
from tests.conftest import REPO


def test_upstream_stages_come_from_dvc_yaml():
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
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return stage.upper()

    out = run_dag(UPSTREAM, run_one, jobs=2)
    assert out == {s: s.upper() for s in UPSTREAM} and peak[0] == 2
    assert started[0] == "world" and started[1] == "validate"  # 3 stages wait below it, 1 below agent_sft
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
