"""The Great Expectations suite: passes a good table, names file, row and column on a bad one."""
import shutil

import pandas as pd
import pytest

from protege.data.validate import validate_tables


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
    assert len(report["files"][str(world_copy / "train.parquet")]["expectations"]) == 7


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


def test_missing_column_is_a_clear_error(world_copy):
    path = world_copy / "train.parquet"
    pd.read_parquet(path).drop(columns=["answer"]).to_parquet(path, index=False)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['answer'\]"):
        validate_tables([path])
