"""Stages under torch's elastic agent: two "nodes" on this machine meet at a c10d rendezvous and end on one
process's weights, and a rank SIGKILLed mid-run costs a restart from the last saved state, not the run.

One tiny project is built once (`dvc repro rl agent_rl`: the uninterrupted one-process runs); each test then
runs a stage again in it, as a scheduler would, and compares the final weights."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from protege import stage_host
from tests.flows.test_pipeline import make_project, mlflow_client, project_env

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

RL_STEPS, AGENT_STEPS = 5, 4


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    proj = make_project(tmp_path_factory.mktemp("elastic"))
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["rl"].update(backend="deepspeed", steps=RL_STEPS, save_every=1, baseline=None)
    params["agent"]["rl"].update(steps=AGENT_STEPS, save_every=1)
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    with stage_host.running():
        done = subprocess.run([sys.executable, "-m", "dvc", "repro", "rl", "agent_rl"], cwd=proj,
                              env=project_env(proj), capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for name in ("rl", "agent_rl"):  # the uninterrupted one-process runs, kept aside
        shutil.copytree(proj / "models" / name, proj.parent / f"one-process-{name}")
    return proj


def final_weights(folder: Path, steps: int) -> dict:
    return load_file(folder / f"step-{steps:05d}" / "model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def fresh(proj: Path, name: str, params: dict | None = None) -> None:
    """The stage's outputs gone (they persist between runs, and a state there would be resumed)."""
    shutil.rmtree(proj / "models" / name, ignore_errors=True)
    if params:
        doc = yaml.safe_load((proj / "params.yaml").read_text())
        section = doc["agent"]["rl"] if name == "agent_rl" else doc[name]
        section.update(params)
        (proj / "params.yaml").write_text(yaml.safe_dump(doc))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_meet_at_one_endpoint_and_end_on_one_process_weights(project):
    """Node 0 is the stage DVC runs (its node rank and endpoint in the environment, as a pod gets them); node 1
    is `protege stage rl --nodes 2 --node-rank 1 --rdzv-endpoint ...` alone. One rank each, gloo, DeepSpeed."""
    fresh(project, "rl", {"processes": 1, "max_restarts": 0})
    endpoint = f"127.0.0.1:{free_port()}"
    env0 = dict(project_env(project), PROTEGE_NODES="2", PROTEGE_NODE_RANK="0", PROTEGE_RDZV_ENDPOINT=endpoint)
    node0 = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "-f", "-s", "rl"], cwd=project, env=env0,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    node1 = subprocess.Popen([sys.executable, "-m", "protege", "stage", "rl", "--nodes", "2", "--node-rank", "1",
                              "--rdzv-endpoint", endpoint], cwd=project, env=project_env(project),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out0, _ = node0.communicate(timeout=600)
        out1, _ = node1.communicate(timeout=120)
    finally:  # a node left waiting at the rendezvous is stopped with its ranks
        for node in (node0, node1):
            if node.poll() is None:
                node.terminate()
                node.wait(timeout=60)
    assert node0.returncode == 0, out0[-4000:]
    assert node1.returncode == 0, out1[-4000:]
    assert "rl: 1 processes (gloo) on each of 2 nodes (this is node 0)" in out0
    assert "(this is node 1)" in out1
    # one checkpoint folder, written by node 0's rank 0
    assert sorted(p.name for p in (project / "models").iterdir() if p.name.startswith("rl")) == ["rl"]
    state = yaml.safe_load((project / "models/rl/state/state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == RL_STEPS
    two = final_weights(project / "models/rl", RL_STEPS)
    one = final_weights(project.parent / "one-process-rl", RL_STEPS)
    assert max_difference(two, one) < 1e-4  # the same answers were drawn; the sums differ in float order
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "rl"], cwd=project, env=project_env(project),
                            capture_output=True, text=True)
    assert "up to date" in status.stdout, status.stdout


def test_dvc_repro_runs_two_ranks_for_rl_and_agent_rl(project):
    """`processes: 2` with `backend: deepspeed` under `dvc repro` runs both ranks on the CPU (gloo) for rl and
    agent_rl (PPO with its value head, KL guidance), and only those two stages; rank 0 alone writes the
    checkpoints and reports, the ranks end on the same weights (the loops compare them and stop otherwise), and
    `dvc status` is clean. Its rl weights are the uninterrupted two-rank run the killed-rank test compares with."""
    fresh(project, "rl", {"processes": 2, "max_restarts": 0})
    fresh(project, "agent_rl")
    original = (project / "params.yaml").read_text()
    doc = yaml.safe_load(original)
    doc["agent"]["rl"].update(backend="deepspeed", processes=2)
    (project / "params.yaml").write_text(yaml.safe_dump(doc))
    try:
        with stage_host.running():
            done = subprocess.run([sys.executable, "-m", "dvc", "repro", "rl", "agent_rl"], cwd=project,
                                  env=project_env(project), capture_output=True, text=True, timeout=1200)
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-4000:]
        assert {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage")} == {
            "rl", "agent_rl"}
        assert "rl: 2 processes (gloo)" in log and "agent_rl: 2 processes (gloo)" in log
        assert json.loads((project / "reports/stages/rl.json").read_text())["processes"] == 2
        assert sorted(p.name for p in (project / "models/rl").glob("step-*")) == [
            f"step-{i:05d}" for i in range(1, RL_STEPS + 1)]
        curve = (project / "reports/rl/learning_curve.csv").read_text().splitlines()
        assert [line.split(",")[0] for line in curve[1:]] == [str(i) for i in range(RL_STEPS + 1)]
        assert all(0.0 <= float(line.split(",")[1]) <= 1.0 for line in curve[1:])
        assert (project / "models/agent_rl/merged-teacher/model.safetensors").exists()
        assert json.loads((project / "reports/agent/summary.json").read_text())["end"]["episodes"] == 4
        status = subprocess.run([sys.executable, "-m", "dvc", "status", "rl", "agent_rl"], cwd=project,
                                env=project_env(project), capture_output=True, text=True)
        assert "up to date" in status.stdout, status.stdout
    finally:  # the multi-turn restart test below compares one rank with the one-process run
        (project / "params.yaml").write_text(original)


def rank_pid(stage: str, rank: int, parent: int) -> int | None:
    """The pid of a stage's rank started by the agent in process `parent` (its environment says which)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and f"RANK={rank}".encode() in env and f"TORCHELASTIC_RUN_ID=protege-{stage}".encode() in env:
            return int(entry.name)
    return None


def kill_a_rank_mid_run(proj: Path, stage: str, out: str, rank: int, steps: int) -> subprocess.CompletedProcess:
    """Runs `protege stage NAME` and SIGKILLs `rank` once the run has saved its second step."""
    proc = subprocess.Popen([sys.executable, "-m", "protege", "stage", stage], cwd=proj, env=project_env(proj),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_at = None
    deadline = time.monotonic() + 600
    try:
        while proc.poll() is None and killed_at is None and time.monotonic() < deadline:
            if (proj / "models" / out / "step-00002").exists():
                pid = rank_pid(stage, rank, proc.pid)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed_at = sorted(p.name for p in (proj / "models" / out).glob("step-*"))[-1]
            time.sleep(0.05)
        stdout, _ = proc.communicate(timeout=600)
    finally:  # a stage that hangs is stopped with its ranks (the agent stops them on SIGTERM)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert killed_at is not None and killed_at != f"step-{steps:05d}", \
        f"the run ended before rank {rank} could be killed:\n{stdout[-3000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "")


def test_a_killed_rank_restarts_the_question_loop_from_its_last_state(project):
    """Two ranks, max_restarts 1: rank 1 is SIGKILLed after step 2 was saved; the group restarts, resumes from
    the state and ends on bitwise the weights of the uninterrupted two-rank run (the `dvc repro` test's)."""
    if not (project / "models/rl/state").exists():
        pytest.skip("needs the uninterrupted two-rank run's weights")
    two_ranks = final_weights(project / "models/rl", RL_STEPS)
    fresh(project, "rl", {"processes": 2, "max_restarts": 1})
    done = kill_a_rank_mid_run(project, "rl", "rl", 1, RL_STEPS)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "rl: restart 1 after a rank failed; resuming from the last saved training state" in done.stdout
    after = final_weights(project / "models/rl", RL_STEPS)
    assert max_difference(after, two_ranks) == 0.0
    client = mlflow_client(project)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`protege.stage` = 'rl' and tags.elastic_restarts = '1'")
    assert len(runs) == 1 and runs[0].data.metrics["elastic_restarts"] == 1.0


def test_a_killed_rank_restarts_the_multi_turn_loop_from_its_last_state(project):
    """agent_rl (PPO with its value head, GTR-Turbo's merged teacher) under the agent with one restart: its one
    rank SIGKILLed mid-run, the restarted rank resumes and ends on bitwise the uninterrupted run's weights."""
    fresh(project, "agent_rl", {"max_restarts": 1})
    done = kill_a_rank_mid_run(project, "agent_rl", "agent_rl", 0, AGENT_STEPS)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "agent_rl: restart 1 after a rank failed" in done.stdout
    after = final_weights(project / "models/agent_rl", AGENT_STEPS)
    assert max_difference(after, final_weights(project.parent / "one-process-agent_rl", AGENT_STEPS)) == 0.0
    value = load_file(project / "models/agent_rl/state/value_head.safetensors")
    reference = load_file(project.parent / "one-process-agent_rl/state/value_head.safetensors")
    assert max_difference(value, reference) == 0.0


def test_a_rank_that_keeps_dying_fails_the_stage_naming_it(project):
    """With no restart left the stage fails, naming the rank and how it ended; what was saved stays."""
    fresh(project, "rl", {"processes": 2, "max_restarts": 0})
    done = kill_a_rank_mid_run(project, "rl", "rl", 1, RL_STEPS)
    assert done.returncode != 0
    assert "rank 1 of 2 failed (killed by signal SIGKILL)" in done.stdout
    assert (project / "models/rl/state/state.json").exists()
