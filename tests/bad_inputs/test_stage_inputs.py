"""A stage handed a broken data table stops with one error naming the file (exit 1), not a traceback."""
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from protege.cli import app

ROOT = Path(__file__).resolve().parents[2]


def broken_world(project: Path, case: str) -> Path:
    world = project / "data" / "world"
    world.mkdir(parents=True)
    good = pd.DataFrame({"id": ["1"], "question": ["Q?"], "answer": ["A"], "image": ["x.png"]})
    for split in ("train", "rl", "val", "test"):
        good.to_parquet(world / f"{split}.parquet")
    bad = world / "rl.parquet"
    if case == "not_parquet":
        bad.write_text("id,question,answer,image\n1,Q,A,x.png\n")
    elif case == "missing_column":
        good.drop(columns=["image"]).to_parquet(bad)
    elif case == "folder":
        bad.unlink()
        bad.mkdir()
    elif case == "missing":
        bad.unlink()
    return bad


# each message names the split table as the project knows it, and what was expected of it
@pytest.mark.parametrize("case, why", [
    ("not_parquet", "data/world/rl.parquet: not a readable parquet file (ArrowInvalid: "),
    ("missing_column", "data/world/rl.parquet: missing column(s) ['image']; the 'rl' split table needs "
                       "['id', 'question', 'answer', 'image']"),
    ("folder", "data/world/rl.parquet: is a folder; expected the 'rl' split as a parquet table"),
    ("missing", "data/world/rl.parquet: 'rl' split file not found; expected a parquet table with columns "
                "['id', 'question', 'answer', 'image']")])
def test_validate_stage_names_the_broken_table(tmp_path, case, why):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    broken_world(tmp_path, case)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = CliRunner().invoke(app, ["stage", "validate"])
    finally:
        os.chdir(old)
    assert res.exit_code == 1, res.output
    assert why in res.output and "Traceback" not in res.output and "Errno" not in res.output, res.output
    assert len(res.output.strip().splitlines()[-1]) > 0 and not (tmp_path / "reports" / "validation.json").exists()
