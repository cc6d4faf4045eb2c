"""Two stages running side by side log the same dataset: MLflow's sqlite store can refuse the second insert
(a UNIQUE constraint); the stage asks again and links the row the other stage wrote, any other error stands."""
import types

import mlflow
import pytest

from protege.tracking import StageRun


def _run(tmp_path, failures):
    calls = []

    def log_input(ds, context):
        calls.append((ds.name, context))
        if failures:
            raise mlflow.exceptions.MlflowException(failures.pop(0))

    fake = types.SimpleNamespace(log_input=log_input, exceptions=mlflow.exceptions)
    (tmp_path / "table.parquet").write_bytes(b"rows")
    return StageRun(fake, None, tmp_path), calls


def test_a_lost_insert_race_is_asked_again(tmp_path):
    run, calls = _run(tmp_path, ["(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                 "datasets.name, datasets.digest"])
    run.log_input("table.parquet", context="questions")
    assert calls == [("table.parquet", "questions")] * 2


def test_other_errors_stand(tmp_path):
    run, calls = _run(tmp_path, ["RESOURCE_DOES_NOT_EXIST: no such run"])
    with pytest.raises(mlflow.exceptions.MlflowException, match="no such run"):
        run.log_input("table.parquet", context="questions")
    assert len(calls) == 1
