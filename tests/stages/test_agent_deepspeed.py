"""The multi-turn loop's PPO (value head) with GTR-Turbo's guidance on two DeepSpeed ranks (CPU, gloo): it ends
on the weights, policy and value head, of one process running the whole batch, and a run stopped mid-way and
resumed by fresh processes ends on the uninterrupted run's. Each rank is a process of
tests/stages/agent_ds_worker.py (3 layouts a step: 2 on rank 0, 1 on rank 1; sampling with top_k 1, so the
episodes do not depend on which rank plays them)."""
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

TOLERANCE = 1e-5  # fp32 throughout; the ranks sum their shares of the batch in another order than one process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out, world_size, runs: list[tuple]) -> dict[str, list[dict]]:
    """World_size processes that each play `runs` ((zero_stage, tag, *options) each) one after another; each
    run's results by tag, one per rank. Runs share a process (imports and DeepSpeed set-up paid once), never
    a training state: each is seeded and kept in files of its own."""
    port = str(free_port())
    argv = []
    for zero_stage, tag, *extra in runs:
        argv += [*(["--next"] if argv else []), str(out), str(zero_stage), f"--tag={tag}", *extra]
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.stages.agent_ds_worker", *argv], cwd=REPO,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-4000:]
    return {tag: [json.loads((out / f"rank{r}{tag}.json").read_text()) for r in range(world_size)]
            for _, tag, *_ in runs}


def final(out, tag) -> dict[str, torch.Tensor]:
    return load_file(str(out / f"final{tag}.safetensors"))


def largest_difference(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


EQUIVALENCE = {"zero2-kl": (2, "kl", None, "token"), "zero3-kl": (3, "kl", None, "token"),
               "zero2-sft-micro": (2, "sft", 500, "token"), "zero2-kl-rl4vlm": (2, "kl", None, "rl4vlm")}


@pytest.fixture(scope="module")
def equivalence_runs(tmp_path_factory):
    """Every setting of the test below, in one process and then on two ranks (two launches, not eight)."""
    out = tmp_path_factory.mktemp("agent-ds-equivalence")
    runs = {name: (zero, "--guidance", guidance, "--objective", objective, *(("--micro", str(micro)) if micro else ()))
            for name, (zero, guidance, micro, objective) in EQUIVALENCE.items()}
    one = launch(out, 1, [(zero, f"-{name}-one", *extra) for name, (zero, *extra) in runs.items()])
    two = launch(out, 2, [(zero, f"-{name}-two", *extra) for name, (zero, *extra) in runs.items()])
    return out, one, two


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EQUIVALENCE))
def test_two_ranks_end_on_one_process_weights(equivalence_runs, name):
    """3 steps of PPO (the first the value head's warm-up) with the merged teacher's KL on the rewards, or with its
    SFT on the thoughts it writes (then also several micro-batches a rank, as many on each), or with RL4VLM's
    per-output ratio: the value loss, the ratio term's outputs, GAE's normalisation, the SFT term and its contexts
    are the whole batch's, so two ranks take one process's steps."""
    zero_stage, guidance, micro, objective = EQUIVALENCE[name]
    out, ones, twos = equivalence_runs
    [one], two = ones[f"-{name}-one"], twos[f"-{name}-two"]
    assert one["steps"] == 3 and two[0]["steps"] == two[1]["steps"] == 3
    assert two[0]["digest"] == two[1]["digest"]  # both ranks hold the same policy and value head
    a, b = final(out, f"-{name}-one"), final(out, f"-{name}-two")
    assert any(k.startswith("value_head.") for k in a) and any(k.startswith("policy.") for k in a)
    assert any(float(a[k].abs().sum()) > 0 for k in a if k.startswith("value_head."))  # the head was trained
    assert one["logs"][-1]["kl_merged"] > 0  # and the policy: it moved away from the merged teacher
    diff = largest_difference(a, b)
    print(f"largest |one process - two ranks| ({zero_stage=}, {guidance=}, {micro=}, {objective=}): {diff:.3g}")
    assert diff <= TOLERANCE
    for m1, m2 in zip(one["logs"], two[0]["logs"]):  # the whole batch's figures, too
        for key in ("value_loss", "kl_merged", *(("sft_loss",) if guidance == "sft" else ())):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    if guidance == "sft":
        assert all(m["sft_loss"] > 0 and m["teacher_parse_rate"] == 1.0 for m in one["logs"])
    if micro:
        assert all(m["micro_batches"] > 1 for m in two[0]["logs"])


RESUMED = {"zero2-kl": (2, "kl"), "zero3-sft": (3, "sft")}


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory):
    """Both settings of the test below: uninterrupted, stopped after step 2, resumed: three launches of two
    ranks, each launch running the two settings one after the other."""
    out = tmp_path_factory.mktemp("agent-ds-resume")
    full = launch(out, 2, [(zero, f"-{name}-full", "--guidance", g) for name, (zero, g) in RESUMED.items()])
    stopped = launch(out, 2, [(zero, f"-{name}-part", "--guidance", g, "--stop-after", "2")
                              for name, (zero, g) in RESUMED.items()])
    at_stop = {name: final(out, f"-{name}-part") for name in RESUMED}
    resumed = launch(out, 2, [(zero, f"-{name}-part", "--guidance", g) for name, (zero, g) in RESUMED.items()])
    return out, full, stopped, at_stop, resumed


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESUMED))
def test_two_ranks_resume_exactly(resume_runs, name):
    """Two ranks stopped after step 2 (their training state saved there: the policy, the value head, each rank's
    ZeRO partition of the optimizer and its torch RNG) and resumed by fresh processes end bitwise on the weights
    of the uninterrupted two-rank run."""
    out, _, stopped, at_stop, resumed = resume_runs
    assert [r["step"] for r in stopped[f"-{name}-part"]] == [2, 2]
    assert [r["steps"] for r in resumed[f"-{name}-part"]] == [1, 1]  # only step 3 ran again
    full, again, at_stop = final(out, f"-{name}-full"), final(out, f"-{name}-part"), at_stop[name]
    assert largest_difference(full, again) == 0.0
    assert any(not torch.equal(at_stop[k], again[k]) for k in at_stop if k.startswith("value_head."))
    assert any(not torch.equal(at_stop[k], again[k]) for k in at_stop if k.startswith("policy."))
