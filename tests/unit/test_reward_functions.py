"""rl.rewards: the entries the config takes, the functions the stage imports, and the reward a function's
output may give: every problem is one line naming the entry or function."""
import pytest
from pydantic import ValidationError

from protege.config import RLConfig
from protege.data.rows import ImageFiles, Row
from protege.errors import UserFacingError
from protege.rewards.functions import call, load_rewards, weighted
from tests.reward_pkg import rewards as pkg

PKG = "tests.reward_pkg.rewards"


def rewards(*entries):
    return RLConfig(rewards=list(entries)).rewards


def test_default_is_empty_and_entries_load():
    assert RLConfig().rewards == []
    terms = load_rewards(rewards({"function": "judge"}, {"function": f"{PKG}:length", "weight": 0.5}))
    assert [(t.name, t.weight) for t in terms] == [("judge", 1.0), (f"{PKG}:length", 0.5)]
    assert terms[0].function is None and terms[1].function is pkg.length


@pytest.mark.parametrize("entries,says", [
    ([{"function": "tests.reward_pkg.rewards"}], "rl.rewards[0]: function 'tests.reward_pkg.rewards'"),
    ([{"function": "judge"}, {"function": "a b:c"}], "rl.rewards[1]: function 'a b:c'"),
    ([{"function": "judge", "weight": float("nan")}], "rl.rewards[0]: weight nan of judge is not finite"),
    ([{"function": "m:f", "weight": float("inf")}], "rl.rewards[0]: weight inf of m:f is not finite"),
    ([{"function": "m:f"}, {"function": "m:f", "weight": 2}], "rl.rewards[1]: m:f is already rl.rewards[0]"),
    ([{"function": "m:f", "wieght": 2}], "rl.rewards[0]: unknown key(s) ['wieght']"),
    ([{"weight": 2}], "rl.rewards[0]: expects a function name"),
    (["m:f"], "rl.rewards[0]: expected {function"),
    ([{"function": "m:f", "weight": "high"}], "rl.rewards[0]: weight expects a number"),
])
def test_bad_entries_name_their_place(entries, says):
    with pytest.raises(ValidationError) as err:
        RLConfig(rewards=entries)
    assert says in str(err.value)


def test_a_params_file_error_is_one_line(tmp_path):
    from protege.config import ConfigError, load_config

    path = tmp_path / "params.yaml"
    path.write_text("rl:\n  rewards:\n    - {function: judge}\n    - {function: judge, weight: 2}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "rl.rewards[1]: judge is already rl.rewards[0]" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name,says", [
    ("tests.reward_pkg.absent:f", "rl.rewards[0]: tests.reward_pkg.absent:f: cannot import tests.reward_pkg.absent "
                                  "(ModuleNotFoundError"),
    (f"{PKG}:missing", f"rl.rewards[0]: {PKG}:missing: module {PKG}"),
    (f"{PKG}:NOT_A_FUNCTION", f"rl.rewards[0]: {PKG}:NOT_A_FUNCTION: NOT_A_FUNCTION is a int, not a function"),
])
def test_a_function_that_cannot_load_is_named(name, says):
    with pytest.raises(UserFacingError) as err:
        load_rewards(rewards({"function": name}))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_project_folder_goes_on_the_path(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text("def short(responses, **_):\n    return [-len(r) for r in responses]\n")
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    monkeypatch.delitem(__import__("sys").modules, "myrewards", raising=False)
    term, = load_rewards(rewards({"function": "myrewards:short"}), tmp_path)
    assert term.function(responses=["ab", "c"]) == [-2, -1]


def rows(n):
    files = ImageFiles(__import__("pathlib").Path("/data/t.parquet"), 0, "q0", ("img/a.png", "img/b.png"))
    return [Row(f"q{k}", "kind", f"question {k}", "B", ["A", "B"], files if k == 0 else None) for k in range(n)]


def test_a_function_gets_the_batch_as_keywords():
    pkg.CALLS.clear()
    term, = load_rewards(rewards({"function": f"{PKG}:has_letter"}))
    assert call(term, rows(2), ["yes", "no"], [False, True]) == [1.0, 0.0]
    got = pkg.CALLS[-1]
    assert got == dict(questions=["question 0", "question 1"], references=["B", "B"], responses=["yes", "no"],
                       images=[["/data/img/a.png", "/data/img/b.png"], None], ids=["q0", "q1"],
                       is_teacher=[False, True])


@pytest.mark.parametrize("function,says", [
    ("one_short", f"rl.rewards: {PKG}:one_short returned 2 values for 3 responses"),
    ("nan_for_first", f"rl.rewards: {PKG}:nan_for_first returned nan for response 0 ('a'): a reward must be finite"),
    ("raises", f"rl.rewards: {PKG}:raises raised KeyError: 'no score for this response'"),
    ("not_numbers", f"rl.rewards: {PKG}:not_numbers returned list, expected a sequence of 3 floats"),
])
def test_an_unusable_reward_stops_naming_the_function(function, says):
    term, = load_rewards(rewards({"function": f"{PKG}:{function}"}))
    with pytest.raises(UserFacingError) as err:
        call(term, rows(3), ["a", "b", "c"], [False] * 3)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_weighted_sum_and_the_judge_alone_unchanged():
    terms = load_rewards(rewards({"function": "judge"}, {"function": f"{PKG}:length", "weight": -0.5}))
    assert weighted(terms, {"judge": [1.0, 0.0], f"{PKG}:length": [0.2, 0.4]}) == [0.9, -0.2]
    judge, = load_rewards(rewards({"function": "judge"}))
    scores = [0.1 + 0.2, -0.0, 1e-300]
    assert all(a.hex() == b.hex() for a, b in zip(weighted([judge], {"judge": scores}), scores))
