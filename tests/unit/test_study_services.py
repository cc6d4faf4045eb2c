"""The loopback server as an LLM judge (grading by the rule-based judge), and a study starting it."""
import json
import socket

import pandas as pd
import pytest

from protege.rewards.llm_judge import LLMJudge
from protege.loopback_server import ServerBehaviour, rule_verdicts, serve_in_thread
from protege.teachers.openai_backend import OpenAITeacher


def test_loopback_judge_grades_like_the_rule_judge(tmp_path):
    table = tmp_path / "rows.parquet"
    pd.DataFrame({"question": ["What colour is the square?"], "answer": ["red"],
                  "candidates": [json.dumps(["red", "blue", "green"])]}).to_parquet(table)
    behaviour = ServerBehaviour(reply=rule_verdicts([str(table)]))
    with serve_in_thread(behaviour) as url:
        judge = LLMJudge(OpenAITeacher("judge", url, "loopback-judge", api_key_env=None))
        got = judge(["What colour is the square?"] * 3 + ["How many circles?", "Which option? A. x B. y"] * 2,
                    ["red"] * 3 + ["3", "B"] * 2,
                    ["It is red.", "blue, not red... no: blue", "The square looks green",
                     "I count 3.", "The answer is B.", "two", "A"])
    # with the table's candidates the last colour named counts; numbers and letters need no table
    assert got == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0] and judge.unparsable == 0


def test_loopback_judge_answers_other_prompts_unparsably():
    assert "only grade" in rule_verdicts([])("Write a poem.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_study_starts_the_judge_a_run_needs_and_stops_it(tmp_path):
    import shutil

    from protege.errors import UserFacingError
    from protege.study import services
    from protege.study.spec import load_study
    from tests.conftest import REPO

    port = free_port()
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "s.yaml").write_text(f"""
seeds: [1]
baseline: rule
variants:
  rule: {{}}
  llm: {{rl.judge: llm, rl.judge_model: {{name: j, backend: openai, model: m, base_url: "http://127.0.0.1:{port}/v1"}}}}
services:
  judge: {{port: {port}}}
""")
    study = load_study(tmp_path / "s.yaml", tmp_path)
    rule, llm = study.variants["rule"].config, study.variants["llm"].config
    assert services.needed(study, [rule]) == {} and list(services.needed(study, [rule, llm])) == ["judge"]
    with services.running(study, [llm], log=lambda m: None) as pids:
        assert len(pids) == 1
        judge = LLMJudge(OpenAITeacher("j", f"http://127.0.0.1:{port}/v1", "m", api_key_env=None))
        assert judge(["How many?"], ["4"], ["4"]) == [1.0]
        with pytest.raises(UserFacingError, match=f"port {port} is already in use"):
            services.start(study, [llm])
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # stopped
