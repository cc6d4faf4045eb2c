"""Broken params files through the public commands: exit 2, one line naming the file, line and key,
no traceback, nothing written."""
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from protege.cli import app

# (name, file bytes, what the one-line message must say)
CASES = [
    ("duplicate_section", b"sft:\n  steps: 10\nsft:\n  lr: 0.1\n", ":3: duplicate key 'sft' (first given at line 1)"),
    ("duplicate_key", b"rl:\n  lr: 0.1\n  steps: 5\n  lr: 0.2\n", ":4: duplicate key 'lr' (first given at line 2)"),
    ("yaml11_yes", b"sft:\n  steps: yes\n", ":2: key 'sft.steps' expects int"),
    ("yaml11_off", b"rl:\n  eval_every: off\n", ":2: key 'rl.eval_every' expects int"),
    ("boolean_for_int", b"rl:\n  steps: true\n", ":2: key 'rl.steps' expects int, got the boolean true"),
    ("boolean_for_float", b"sft:\n  lr: false\n", ":2: key 'sft.lr' expects float, got the boolean false"),
    ("infinite", b"sft:\n  lr: .inf\n", ":2: key 'sft.lr' expects float: Input should be a finite number"),
    ("nan", b"rl:\n  kl_beta: .nan\n", ":2: key 'rl.kl_beta' expects float: Input should be a finite number"),
    ("absurd_steps", b"sft:\n  steps: 100000000000\n", ":2: key 'sft.steps' 100000000000 is out of range"),
    ("typo_steps", b"rl:\n  steps: 50000000\n", ":2: key 'rl.steps' expects int: Input should be less than or equal"),
    ("absurd_lr", b"rl:\n  lr: 1.0e+9\n", ":2: key 'rl.lr' expects float: Input should be less than or equal to 10"),
    ("negative", b"world:\n  n_test: -4\n", ":2: key 'world.n_test' expects int: Input should be greater than"),
    ("vllm_in_the_tool_loop", b"tool:\n  rl:\n    generation: vllm\n",
     ":3: key 'tool.rl.generation' is vllm, but the multi-turn loop samples with transformers only"),
    ("empty", b"", ": the params file is empty"),
    ("comments_only", b"# nothing here\n\n", ": the params file is empty"),
    ("not_utf8", b"sft:\n  schedule: cosine\xff\n", ":2: not UTF-8 text (byte 0xff at offset 23)"),
    ("latin1", "world:\n  seed: 1\n# r\xe9sum\xe9\n".encode("latin-1"), ":3: not UTF-8 text"),
    ("syntax", b"sft:\n  steps: [1\n", ":3: not valid YAML"),
    ("tab_indent", b"sft:\n\tsteps: 1\n", ":2: not valid YAML"),
    ("top_level_list", b"- sft\n", ":1: expected a mapping of sections"),
    ("unknown_key", b"sft:\n  stepz: 1\n", ":2: unknown key 'sft.stepz'"),
    ("string_for_section", b"rl: fast\n", ":1: key 'rl' expects RLConfig"),
]


def _run(args, cwd: Path):
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, args)
    finally:
        os.chdir(old)


def _snapshot(folder: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.mark.parametrize("name, content, expected", CASES, ids=[c[0] for c in CASES])
def test_config_show_rejects(tmp_path, name, content, expected):
    bad = tmp_path / "params.yaml"
    bad.write_bytes(content)
    before = _snapshot(tmp_path)
    res = _run(["config", "show", "--params", str(bad)], tmp_path)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}") and expected in lines[0], res.output
    assert "Traceback" not in res.output and _snapshot(tmp_path) == before


def test_a_folder_or_a_missing_file_as_params(tmp_path):
    res = _run(["config", "show", "--params", str(tmp_path)], tmp_path)
    assert res.exit_code == 2 and f"error: {tmp_path}: is a folder; expected a params file" in res.output
    res = _run(["config", "show", "--params", str(tmp_path / "nope.yaml")], tmp_path)
    assert res.exit_code == 2 and "nope.yaml: no such params file" in res.output


@pytest.mark.parametrize("name, content, expected", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_eval_score_and_study_reject_the_same_way(tmp_path, name, content, expected):
    bad = tmp_path / "params.yaml"
    bad.write_bytes(content)
    res = _run(["eval", "score", "--benchmark", "ai2d", "--data", str(tmp_path / "x.tsv"), "--predictions",
                str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "out"), "--params", str(bad)], tmp_path)
    assert res.exit_code == 2 and expected in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "out").exists()
    study = tmp_path / "s.yaml"
    study.write_text("seeds: [1]\nbaseline: a\nvariants:\n  a: {}\n")
    res = _run(["study", str(study), "--dry-run", "--project", str(tmp_path)], tmp_path)
    assert res.exit_code == 2 and expected in res.output, res.output


def test_study_file_duplicate_key(tmp_path):
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    study = tmp_path / "s.yaml"
    study.write_text("seeds: [1]\nbaseline: a\nvariants:\n  a: {}\n  a: {rl: {lr: 0.1}}\n")
    res = _run(["study", str(study), "--dry-run", "--project", str(tmp_path)], tmp_path)
    assert res.exit_code == 2 and ":5: duplicate key 'a' (first given at line 4)" in res.output, res.output


@pytest.mark.parametrize("name, content, expected", CASES[:3] + CASES[12:13],
                         ids=["dup_section", "dup_key", "yes", "empty"])
def test_a_stage_with_bad_params_writes_nothing(tmp_path, name, content, expected):
    """What `dvc repro` runs: rejected before any output, MLflow store or report is touched, so
    `dvc status` stays as it was."""
    (tmp_path / "params.yaml").write_bytes(content)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "kept.txt").write_text("already computed")
    before = _snapshot(tmp_path)
    res = _run(["stage", "sft"], tmp_path)
    assert res.exit_code == 2 and expected in res.output and "Traceback" not in res.output, res.output
    assert _snapshot(tmp_path) == before
