"""The RL step reads in one screen: each loop's entry is short, no function in protege/rl/ is long, and both
loops run the one shared step; objectives are chosen once by name."""
import ast
from pathlib import Path

import pytest

from protege.config import AgentRLConfig, RLConfig
from protege.rl.objectives import OBJECTIVES, objective_name

RL = Path(__file__).resolve().parents[2] / "protege" / "rl"


def functions():
    for path in sorted(RL.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, node, node.end_lineno - node.lineno + 1


def test_no_function_in_rl_is_over_60_lines():
    long = [f"{p.relative_to(RL)}:{n.name} ({lines})" for p, n, lines in functions() if lines > 60]
    assert not long, long


@pytest.mark.parametrize("module,name", [("loop.py", "run_rl"), ("agent_loop.py", "run_agent_rl")])
def test_each_loop_is_a_rollout_and_a_session_on_the_shared_step(module, name):
    [(_, node, lines)] = [(p, n, k) for p, n, k in functions() if p.name == module and n.name == name]
    assert lines <= 40
    calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert {"open_session", "train"} <= calls


@pytest.mark.parametrize("cfg,name", [
    (RLConfig(algorithm="ril"), "clipped"), (RLConfig(algorithm="grpo"), "clipped"),
    (AgentRLConfig(algorithm="gtpo"), "clipped"), (AgentRLConfig(algorithm="ppo"), "ppo"),
    (AgentRLConfig(algorithm="ppo", ppo={"objective": "rl4vlm"}), "rl4vlm")])
def test_an_algorithm_picks_its_objective_by_name(cfg, name):
    assert objective_name(cfg) == name and name in OBJECTIVES
