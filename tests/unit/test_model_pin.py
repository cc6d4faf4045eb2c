"""model.path: `protege model pin` records the folder's content digest in params.yaml (keeping its comments),
and a stage refuses a folder whose files changed since, naming the command that re-pins it."""
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from protege.cli import app
from protege.config import load_config
from protege.errors import UserFacingError
from protege.stages.student_model import base_model_dir, init_dir
from tests.conftest import REPO
from tests.families import build_family


@pytest.fixture
def project(tmp_path):
    folder = build_family("gemma3", tmp_path / "ckpt" / "gemma3")
    text = (REPO / "params.yaml").read_text().replace("  path: null", f"  path: {folder}", 1)
    assert f"path: {folder}" in text
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "params.yaml").write_text(text)
    return tmp_path / "proj", folder


def test_pin_then_a_changed_folder_is_refused(project):
    proj, folder = project
    cfg = load_config(proj / "params.yaml")
    with pytest.raises(UserFacingError, match="model.digest is not set, but .* now has digest .*protege model pin"):
        base_model_dir(cfg, proj)
    res = CliRunner().invoke(app, ["model", "pin", "--project", str(proj)])
    assert res.exit_code == 0, res.output
    text = (proj / "params.yaml").read_text()
    assert "# " in text  # comments kept
    cfg = load_config(proj / "params.yaml")
    assert cfg.model.digest == res.output.strip().splitlines()[-1] and len(cfg.model.digest) == 32
    assert base_model_dir(cfg, proj) == folder and init_dir(cfg, proj) == folder  # sft.init's default: the base
    (folder / "generation_config.json").write_text((folder / "generation_config.json").read_text() + "\n")
    with pytest.raises(UserFacingError, match=f"model.digest is {cfg.model.digest}, but {folder} now has digest"):
        base_model_dir(cfg, proj)


def test_the_world_student_needs_no_pin(tmp_path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    cfg = load_config(tmp_path / "params.yaml")
    assert base_model_dir(cfg, tmp_path) == tmp_path / "models/base"
    res = CliRunner().invoke(app, ["model", "pin", "--project", str(tmp_path)])
    assert res.exit_code == 2 and "model.path is not set" in res.output
    assert yaml.safe_load((tmp_path / "params.yaml").read_text())["model"].get("digest") is None
