"""Real DVC on a project holding the agent warm start's stage as protege renders it: an RL setting changed in
params.yaml leaves the warm start up to date; one of its own settings does not."""
import subprocess
import sys
from pathlib import Path

import yaml

from protege import dag
from protege.config import Config

DVC = [sys.executable, "-m", "dvc"]


def dvc(project: Path, *args: str) -> str:
    return subprocess.run(DVC + list(args), cwd=project, check=True, capture_output=True, text=True).stdout


def test_an_rl_setting_leaves_the_warm_start_up_to_date(tmp_path):
    cfg = Config()
    stage = yaml.safe_load(dag.render(cfg))["stages"]["agent_sft"]
    # the rendered params, with a command standing in for the training (its code deps are not in this project)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"agent_sft": {
        "cmd": "python -c \"open('warm_start.txt', 'w').write('trained')\"",
        "params": stage["params"], "outs": ["warm_start.txt"]}}}))
    params = cfg.model_dump(mode="json")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    dvc(tmp_path, "init", "--no-scm", "-q")
    dvc(tmp_path, "repro", "-q")
    params["agent"]["rl"]["lr"] *= 10
    params["agent"]["rl"]["algorithm"] = "grpo"
    params["agent"]["eval_episodes"] += 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert "up to date" in dvc(tmp_path, "status")
    params["agent"]["sft"]["lr"] *= 10
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    changed = dvc(tmp_path, "status")
    assert "agent_sft" in changed and "agent.sft.lr" in changed
