"""The warm stage host: a `protege stage` command run through it behaves as one run in its own process."""
import os
import subprocess
import sys
import time
from pathlib import Path

from protege import stage_host
from tests.conftest import REPO


def protege(args, cwd, env):
    return subprocess.run([str(Path(sys.executable).parent / "protege"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def wait_for(path: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the stage host did not come up"
        time.sleep(0.2)


def test_a_stage_runs_in_the_host_with_its_own_output_exit_code_and_folder(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text().replace("n_train: 5400", "n_train: 18")
                                          .replace("n_rl: 576", "n_rl: 9").replace("n_val: 216", "n_val: 9")
                                          .replace("n_test: 1080", "n_test: 9"))
    with stage_host.running() as path:
        wait_for(path)
        env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
        bad = protege(["stage", "no_such_stage"], tmp_path, env)
        assert bad.returncode == 2 and "unknown stage 'no_such_stage'" in bad.stderr  # stderr reached us
        ok = protege(["stage", "world"], tmp_path, env)
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert "base student" in ok.stderr and (tmp_path / "data/world/train.parquet").exists()
        assert (tmp_path / "models/base/model.safetensors").exists()
    assert not os.path.exists(path)


def test_without_a_host_the_command_runs_itself(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    env = dict(os.environ, **{stage_host.SOCKET_ENV: str(tmp_path / "gone.sock")})
    res = protege(["stage", "no_such_stage"], tmp_path, env)
    assert res.returncode == 2 and "unknown stage" in res.stderr


def test_two_stages_through_the_host_at_once(tmp_path):
    """Each request has its own handler: two `protege stage world` commands in two folders, started together,
    both finish with their own outputs (the pipeline's orchestration.jobs runs stages this way)."""
    small = ((REPO / "params.yaml").read_text().replace("n_train: 5400", "n_train: 18").replace("n_rl: 576", "n_rl: 9")
             .replace("n_val: 216", "n_val: 9").replace("n_test: 1080", "n_test: 9"))
    with stage_host.running() as path:
        wait_for(path)
        procs = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "params.yaml").write_text(small)
            env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / name / 'mlflow.db'}")
            procs.append(subprocess.Popen([str(Path(sys.executable).parent / "protege"), "stage", "world"],
                                          cwd=tmp_path / name, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
    for name in ("a", "b"):
        assert (tmp_path / name / "models/base/model.safetensors").exists()
