"""DeepSpeed ZeRO-2/3 on CPU (gloo): one process per stage, and a 2-process data-parallel run."""
import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("deepspeed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, algorithm, stage, world_size):
    port = str(free_port())
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.stages.ds_worker", str(tmp_path), algorithm,
                                       str(stage)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]


@pytest.mark.parametrize("algorithm,stage", [("ril", 2), ("ril", 3)])  # ril: teacher answers give the group a signal
def test_single_process_zero(tmp_path, algorithm, stage):
    [r] = launch(tmp_path, algorithm, stage, 1)
    assert r["steps"] == 2 and r["changed"] > 0


def test_two_processes_stay_in_sync(tmp_path):
    r0, r1 = launch(tmp_path, "ril", 2, 2)
    assert r0["changed"] > 0 and r0["digest"] == r1["digest"]  # gradients averaged: identical weights
    assert (tmp_path / "ckpt" / "step-00002" / "model.safetensors").exists()  # written once, by rank 0
