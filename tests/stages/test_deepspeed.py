"""DeepSpeed ZeRO-2/3 on CPU (gloo): one process per stage, and a 2-process data-parallel run."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO

pytest.importorskip("deepspeed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_runs(out, world_size, runs: list[tuple]) -> dict[str, list[dict]]:
    """World_size processes that each do `runs` ((algorithm, zero_stage, tag, *options) each) one after another;
    each run's results by tag, one per rank. Runs share a process (imports and DeepSpeed set-up paid once),
    never a training state: each is seeded and kept in files of its own."""
    port = str(free_port())
    argv = []
    for algorithm, stage, tag, *extra in runs:
        argv += [*(["--next"] if argv else []), str(out), algorithm, str(stage), f"--tag={tag}", *extra]
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.stages.ds_worker", *argv], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]
    return {tag: [json.loads((out / f"rank{r}{tag}.json").read_text()) for r in range(world_size)]
            for _, _, tag, *_ in runs}


def launch(tmp_path, algorithm, stage, world_size, *extra, tag=""):
    return launch_runs(tmp_path, world_size, [(algorithm, stage, tag, *extra)])[tag]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The single-process runs of this file in one process, then the resume in a fresh one."""
    out = tmp_path_factory.mktemp("ds-one")
    full = ("--steps", "3")
    first = launch_runs(out, 1, [("ril", 2, "-full", *full), ("ril", 2, "-resume", *full, "--state", "--stop-after", "2"),
                                 ("ril", 2, "-ril-2"), ("ril", 3, "-ril-3"), ("agent", 3, "-agent")])
    at_stop = load_file(str(out / "ckpt-resume" / "state" / "policy.safetensors"))
    resumed = launch_runs(out, 1, [("ril", 2, "-resume", *full, "--state")])
    return out, first, at_stop, resumed["-resume"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """The two-rank runs of this file: in sync, and with one row per micro-batch uninterrupted, stopped after
    step 2, and resumed by fresh processes."""
    out = tmp_path_factory.mktemp("ds-two")
    micro = ("--steps", "3", "--micro", "1")
    first = launch_runs(out, 2, [("ril", 2, "-full", *micro), ("ril", 2, "-resume", *micro, "--state", "--stop-after", "2"),
                                 ("ril", 2, "-sync")])
    resumed = launch_runs(out, 2, [("ril", 2, "-resume", *micro, "--state")])
    return out, first, resumed["-resume"]


@pytest.mark.parametrize("algorithm,stage", [("ril", 2), ("ril", 3)])  # ril: teacher answers give the group a signal
def test_single_process_zero(one_process, algorithm, stage):
    [r] = one_process[1][f"-{algorithm}-{stage}"]
    assert r["steps"] == 2 and r["changed"] > 0


def test_agent_loop_updates_through_zero3(one_process):
    """The multi-turn loop under ZeRO-3: episodes are played, the merged teacher follows and checkpoints are
    written with the weights gathered whole."""
    [r] = one_process[1]["-agent"]
    assert r["steps"] == 2 and r["changed"] > 0
    assert r["saved"] == ["step-00001", "step-00002"] and r["teacher"]


def test_two_processes_stay_in_sync(two_ranks):
    out, first, _ = two_ranks
    r0, r1 = first["-sync"]
    assert r0["changed"] > 0 and r0["digest"] == r1["digest"]  # gradients averaged: identical weights
    assert (out / "ckpt-sync" / "step-00002" / "model.safetensors").exists()  # written once, by rank 0


def test_zero2_resume_matches_uninterrupted_run(one_process):
    """3 RIL steps in one go vs a process that stops after step 2 (state saved there) and a fresh one that
    resumes: the policy's weights, discriminator and both ZeRO-2 optimizers come back from our files."""
    tmp_path, first, at_stop, [resumed] = one_process
    [stopped] = first["-resume"]
    assert stopped["steps"] == 2
    assert resumed["steps"] == 1  # only step 3 ran again
    state = tmp_path / "ckpt-resume" / "state"
    moments = load_file(str(state / "optimizer-rank0.safetensors"))  # ZeRO-2's flat fp32 partition, per rank
    assert moments["0.exp_avg"].dim() == 1 and (state / "disc_optimizer-rank0.json").exists()
    full, again = load_file(str(tmp_path / "final-full.safetensors")), load_file(str(tmp_path / "final-resume.safetensors"))
    assert sorted(full) == sorted(again)
    # fp32 throughout and one process: the resumed run repeats the same operations, so the weights are
    # expected to match exactly; allclose with a zero-ish tolerance keeps the failure message readable
    for k in full:
        torch.testing.assert_close(again[k], full[k], rtol=0, atol=0)
    # and the resumed step really trained: the weights moved after the state it resumed from
    assert any(not torch.equal(at_stop[k], again[k]) for k in at_stop if k in again)


def test_two_processes_with_micro_batches_resume_exactly(two_ranks):
    """Two ranks, one row per micro-batch: a run stopped after step 2 and resumed by fresh processes ends on
    the weights of the uninterrupted run, on both ranks."""
    _, first, resumed = two_ranks
    full = first["-full"]
    assert [r["steps"] for r in resumed] == [1, 1]  # only step 3 ran again
    assert {r["digest"] for r in full} == {r["digest"] for r in resumed} and len({r["digest"] for r in full}) == 1
