"""MM-Vet through `evaluate.judge`: an OpenAI-compatible grader (the loopback server) scores free-form
answers; an unparsable grade is asked once more, then scores 0 with a note."""
import re

import pytest

from protege.config import TeacherSpec
from protege.eval.items import BenchItem
from protege.eval.score import Prediction, score_benchmark
from protege.eval.suite import completer_for
from protege.teachers.loopback_server import ServerBehaviour, serve_in_thread


def grade(prompt: str) -> str:
    """A stand-in grader: the prompt's last line is the row to grade (question | truth | prediction |)."""
    prediction = prompt.strip().splitlines()[-1].split("|")[2]
    if "ramble" in prediction:
        return "Let me think about this carefully."
    return "1.0" if re.search(r"\bred\b", prediction) and re.search(r"\b3\b", prediction) else "0.0"


@pytest.mark.parametrize("protocol, requests, prompt_start", [
    ("lmms-eval", 7, "Compare the ground truth"),   # four grades + three retries; lmms-eval's own prompt
    ("lenient", 5, "Grade how correct"),            # four grades + one retry; protege's prompt
])
def test_mmvet_scored_by_an_llm_grader(tmp_path, protocol, requests, prompt_start):
    pytest.importorskip("lmms_eval")
    items = [BenchItem("mmvet", f"v1_{i}", "What colour are the shapes, and how many?", [], "red <AND> 3",
                       category="rec,math") for i in range(4)]
    preds = {"v1_0": "There are 3 red shapes.", "v1_1": "Two blue ones.", "v1_2": "ramble",
             "v1_3": "3 red circles"}
    seen: list[str] = []
    behaviour = ServerBehaviour(reply=lambda prompt: seen.append(prompt) or grade(prompt))
    with serve_in_thread(behaviour) as url:
        spec = TeacherSpec(name="grader", backend="openai", model="grader", base_url=url, max_retries=0,
                           temperature=0.0)
        complete = completer_for(spec, tmp_path, seed=0)
        summary, rows, _ = score_benchmark("mmvet", items, {k: Prediction(k, v) for k, v in preds.items()},
                                           protocol=protocol, complete=complete, n_boot=200)
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.0, 1.0]
    assert summary["score"] == pytest.approx(50.0)
    assert rows[2]["note"] and "rule judge" not in rows[2]["note"]  # the rambling grade: retried, then 0
    assert behaviour.counts["requests"] == requests
    assert summary["protocol"].startswith(protocol)
    assert seen and all(p.startswith(prompt_start) for p in seen)


def test_mmvet_without_a_judge_says_it_is_not_comparable():
    items = [BenchItem("mmvet", "v1_0", "What colour?", [], "red")]
    _, rows, _ = score_benchmark("mmvet", items, {"v1_0": Prediction("v1_0", "red")}, n_boot=100)
    assert rows[0]["score"] == 1.0 and "not comparable" in rows[0]["note"]
