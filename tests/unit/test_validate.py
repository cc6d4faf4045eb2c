"""The Great Expectations suite: passes a good table, names file, row and column on a bad one."""
import shutil

import pandas as pd
import pytest

from protege.data.validate import validate_tables
from protege.errors import UserFacingError


@pytest.fixture
def world_copy(tiny_world, tmp_path):
    dst = tmp_path / "world"
    shutil.copytree(tiny_world, dst)
    return dst


def failures_of(path):
    report, failures = validate_tables([path])
    return report, failures


def test_good_table_passes(world_copy):
    report, failures = failures_of(world_copy / "train.parquet")
    assert failures == [] and report["success"]
    names = {e["expectation"].split(" ")[0] for e in report["files"][str(world_copy / "train.parquet")]["expectations"]}
    assert {"expect_column_values_to_be_unique", "expect_column_value_lengths_to_be_between",
            "expect_column_values_to_be_in_type_list", "expect_column_values_to_be_in_set"} <= names


def test_empty_question_is_named(world_copy):
    path = world_copy / "train.parquet"
    df = pd.read_parquet(path)
    df.loc[5, "question"] = "   "
    df.to_parquet(path, index=False)
    _, failures = failures_of(path)
    assert len(failures) == 1
    line = failures[0].line()
    assert str(path) in line and "column 'question'" in line and "row 5" in line and df.loc[5, "id"] in line
    assert "expect_column_value_lengths_to_be_between" in line


def test_unreadable_image_is_named(world_copy):
    path = world_copy / "test.parquet"
    df = pd.read_parquet(path)
    (world_copy / df.loc[3, "image"]).write_bytes(b"not a png at all")
    _, failures = failures_of(path)
    assert [f.column for f in failures] == ["image"]
    assert "row 3" in failures[0].line()


def test_missing_image_and_duplicate_id(world_copy):
    path = world_copy / "rl.parquet"
    df = pd.read_parquet(path)
    (world_copy / df.loc[0, "image"]).unlink()
    df.loc[2, "id"] = df.loc[1, "id"]
    df.to_parquet(path, index=False)
    _, failures = failures_of(path)
    assert {f.column for f in failures} == {"image", "id"}


def test_image_too_small_and_letter_beyond_options(world_copy):
    from PIL import Image

    path = world_copy / "train.parquet"
    df = pd.read_parquet(path)
    Image.new("RGB", (4, 4)).save(world_copy / df.loc[1, "image"])
    mc = df.index[df["kind"] == "shape_option"][0]
    df.loc[mc, "answer"] = "E"  # four options: A..D
    df.to_parquet(path, index=False)
    _, failures = failures_of(path)
    by_col = {f.column: f for f in failures}
    assert set(by_col) == {"image", "answer"}
    assert "row 1" in by_col["image"].line() and "image sides within" in by_col["image"].line()
    assert f"row {mc}" in by_col["answer"].line() and "names a listed option" in by_col["answer"].line()


def test_missing_column_is_a_clear_error(world_copy):
    path = world_copy / "train.parquet"
    pd.read_parquet(path).drop(columns=["answer"]).to_parquet(path, index=False)
    with pytest.raises(UserFacingError, match=r"missing column\(s\) \[.answer.\]"):
        validate_tables([path])


def test_teacher_answer_and_benchmark_suites():
    from protege.data.schemas import BENCHMARK_ROWS, TEACHER_ANSWERS
    from protege.data.validate import run_suite

    answers = pd.DataFrame({"key": ["a" * 64, "b" * 64, "b" * 64], "teacher": ["t"] * 3, "question_id": ["q"] * 3,
                            "answer": ["ok", "", "fine"], "finish_reason": ["stop", "stop", "eos"],
                            "latency_s": [0.1, 0.2, -1.0], "sample_index": [0, 1, 2]})
    _, failures = run_suite({"answers.parquet": answers}, TEACHER_ANSWERS, id_column="key")
    assert {(f.column, f.expectation.split(" ")[0]) for f in failures} == {
        ("key", "expect_column_values_to_be_unique"), ("answer", "expect_column_value_lengths_to_be_between"),
        ("finish_reason", "expect_column_values_to_be_in_set"), ("latency_s", "expect_column_values_to_be_between")}
    bench = pd.DataFrame({"index": [0, 1], "question": ["Q?", "Q?"], "answer": ["A", "E"],
                          "image_readable": [True, True], "answer_in_options": [True, False]})
    _, failures = run_suite({"mini.tsv": bench}, BENCHMARK_ROWS, id_column="index")
    assert [f.column for f in failures] == ["answer"] and "row 1" in failures[0].line()
