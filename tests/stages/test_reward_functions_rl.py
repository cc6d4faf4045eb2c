"""rl.rewards in the question loop on the tiny world: a function named by its module path gives the step's
answer reward and is logged as reward/<name>; naming the judge alone changes no bit; a broken function stops the
run naming itself; a run with a function resumes exactly."""
import copy

import pytest
import torch

from protege.config import RLConfig
from protege.errors import UserFacingError
from protege.rl.loop import RLInputs, run_rl
from tests.reward_pkg import rewards as pkg
from tests.stages.test_micro_batches import by_question
from tests.stages.test_rl_recipes import BASE, DAPO, rows, run, weights  # noqa: F401 (rows: a fixture)

LETTER = "tests.reward_pkg.rewards:has_letter"


def test_a_named_function_gives_the_answer_reward(tiny_student, tiny_processor, rows, tmp_path):
    pkg.CALLS.clear()
    logs = []
    run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, logs=logs, algorithm="dr_grpo",
        rewards=[{"function": LETTER, "weight": 2.0}])
    assert len(pkg.CALLS) == len(logs) == BASE["steps"]  # once per step, on the whole batch
    answers = BASE["questions_per_step"] * BASE["group_size"]
    for call, m in zip(pkg.CALLS, logs):
        assert len(call["responses"]) == answers and not any(call["is_teacher"])
        share = sum("e" in r for r in call["responses"]) / answers
        assert m[f"reward/{LETTER}"] == pytest.approx(share)
        assert m["reward"] == pytest.approx(2.0 * share) and m["answer_reward_student"] == pytest.approx(2.0 * share)
        # image files travel as paths, never pixels
        assert all(isinstance(p, str) and p.endswith(".png") for paths in call["images"] for p in paths)
        assert set(call["ids"]) <= {r.id for r in rows}
    assert 0 < sum(m[f"reward/{LETTER}"] for m in logs) < len(logs)  # answers with and without the letter


@pytest.mark.parametrize("recipe", [{"algorithm": "grpo"}, DAPO], ids=["grpo", "dapo"])
def test_the_judge_by_name_alone_changes_no_bit(tiny_student, tiny_processor, rows, tmp_path, recipe):
    logs = []
    today = run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path / "a", **recipe)
    named = run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path / "b", logs=logs, **recipe,
                rewards=[{"function": "judge", "weight": 1.0}])
    assert all(torch.equal(today[k], named[k]) for k in today)
    assert any(not torch.equal(today[k], v) for k, v in tiny_student.state_dict().items())
    assert all(m["reward/judge"] == pytest.approx(m["answer_reward_student"]) for m in logs)


def test_a_broken_function_stops_the_run_naming_it(tiny_student, tiny_processor, rows, tmp_path):
    with pytest.raises(UserFacingError, match=r"rl\.rewards: tests\.reward_pkg\.rewards:one_short returned 7 values "
                                              r"for 8 responses"):
        run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, algorithm="grpo",
            rewards=[{"function": "judge"}, {"function": "tests.reward_pkg.rewards:one_short"}])
    with pytest.raises(UserFacingError, match=r"rl\.rewards\[0\]: tests\.reward_pkg\.rewards:absent: module"):
        run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, algorithm="grpo",
            rewards=[{"function": "tests.reward_pkg.rewards:absent"}])


def test_a_run_with_functions_resumes_exactly(tiny_student, tiny_processor, rows, tmp_path):
    mix = [{"function": "judge"}, {"function": "tests.reward_pkg.rewards:length", "weight": -0.1}]

    def final(folder, stop_after=None, state=True):
        student = copy.deepcopy(tiny_student)
        cfg = RLConfig(**{**BASE, "steps": 3, "save_every": 1, "algorithm": "grpo", "rewards": mix})
        run_rl(student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows, judge=by_question), cfg, folder,
               seed=3, state_dir=folder / "state" if state else None, stop_after=stop_after)
        return weights(student)

    reference = final(tmp_path / "a", state=False)
    final(tmp_path / "b", stop_after=2)
    resumed = final(tmp_path / "b")
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
