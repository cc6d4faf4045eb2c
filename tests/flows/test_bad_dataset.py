"""End to end: a broken table stops the flow at validate, naming the column and the row."""
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests.flows.test_pipeline import make_project, project_env, run_flow


@pytest.mark.slow
def test_bad_dataset_stops_the_flow_at_validate(tmp_path):
    proj = make_project(tmp_path)
    # stages one at a time: the flow stops at validate instead of finishing the game chains that do not read the
    # table (how the parallel DAG treats a failed stage is tests/unit/test_parallel_stages.py's)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["orchestration"]["jobs"] = 1
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    env = project_env(proj)
    subprocess.run([sys.executable, "-m", "dvc", "repro", "--single-item", "world"], cwd=proj, env=env, check=True,
                   capture_output=True)
    table = proj / "data/world/train.parquet"
    df = pd.read_parquet(table)
    df.loc[7, "question"] = ""
    df.to_parquet(table, index=False)
    (proj / "data/world" / df.loc[2, "image"]).write_bytes(b"\x89PNG broken")
    # record the edited data as the stage's output, as a user's own import would be
    subprocess.run([sys.executable, "-m", "dvc", "commit", "-f", "world"], cwd=proj, env=env, check=True,
                   capture_output=True)
    proc = run_flow(proj)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "data/world/train.parquet: column 'question'" in out and "row 7" in out
    assert "column 'image'" in out and "row 2" in out
    assert not (proj / "data/curated").exists() and not (proj / "models/sft").exists()

