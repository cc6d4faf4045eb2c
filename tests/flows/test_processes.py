"""Several processes launched by the stage itself: a failing rank stops the others, and the settings that need
DeepSpeed say so. (`dvc repro` with `processes: 2` for rl and agent_rl is in test_elastic.py, on its project.)"""
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")


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
