"""Several processes launched by the stage itself: `processes: 2` with `backend: deepspeed` under `dvc repro`
runs both ranks on the CPU (gloo) for rl and agent_rl; rank 0 alone writes the checkpoints and reports, the
ranks end on the same weights (the loops compare them and stop otherwise), and `dvc status` is clean."""
import json
import subprocess
import sys

import pytest
import yaml

from protege import stage_host
from tests.flows.test_pipeline import make_project, project_env

pytest.importorskip("deepspeed")


@pytest.mark.slow
def test_dvc_repro_runs_two_ranks_for_rl_and_agent_rl(tmp_path):
    proj = make_project(tmp_path)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["rl"].update(backend="deepspeed", processes=2, baseline=None)
    params["agent"]["rl"].update(backend="deepspeed", processes=2)  # PPO with its value head, KL guidance
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    # a warm stage host (what the pipeline flow runs its stages under) spares each `protege stage` DVC starts
    # the imports of a fresh process; the stage itself runs as it would alone (protege/stage_host.py)
    with stage_host.running():
        env = project_env(proj)
        done = subprocess.run([sys.executable, "-m", "dvc", "repro", "rl", "agent_rl"], cwd=proj, env=env,
                              capture_output=True, text=True, timeout=1200)
    env = project_env(proj)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "rl: 2 processes (gloo)" in log and "agent_rl: 2 processes (gloo)" in log
    assert json.loads((proj / "reports/stages/rl.json").read_text())["processes"] == 2
    assert sorted(p.name for p in (proj / "models/rl").glob("step-*")) == ["step-00001", "step-00002"]
    # the learning curve's points: each rank answered half the val rows, rank 0 wrote the sums
    curve = (proj / "reports/rl/learning_curve.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in curve[1:]] == ["0", "1", "2"]
    assert all(0.0 <= float(line.split(",")[1]) <= 1.0 for line in curve[1:])
    assert (proj / "models/agent_rl/merged-teacher/model.safetensors").exists()
    assert json.loads((proj / "reports/agent/summary.json").read_text())["end"]["episodes"] == 4
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "rl", "agent_rl"], cwd=proj, env=env,
                            capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout


def test_a_failing_rank_stops_the_stage_with_its_last_line(tmp_path):
    """A rank that fails takes the others down and the stage fails, naming the rank and its last line."""
    from protege.runtime.launch import launch

    script = tmp_path / "ranks.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1':\n    print('rank one broke: no such file'); sys.exit(3)\n"
                      "time.sleep(60)\n")
    out = subprocess.run([sys.executable, "-c", f"from protege.runtime.launch import launch; import sys; "
                          f"sys.exit(launch([sys.executable, {str(script)!r}], 2, False))"],
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 3
    assert "rank 1 of 2 failed (exit 3)" in out.stderr
    assert "last lines of its stdout" in out.stderr and "rank one broke: no such file" in out.stderr
    assert launch([sys.executable, "-c", "pass"], 2, False) == 0


def test_processes_need_deepspeed_in_one_line(tmp_path):
    from protege.config import ConfigError, load_config

    (tmp_path / "p.yaml").write_text("rl: {processes: 2}\n")
    with pytest.raises(ConfigError, match="rl.processes is 2: several processes need rl.backend: deepspeed"):
        load_config(tmp_path / "p.yaml")
