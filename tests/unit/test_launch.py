"""How many ranks a stage starts: `auto` follows the visible GPUs under DeepSpeed (a Kubernetes job given 4 GPUs
runs 4 ranks), a number is taken as it is, and what cannot run is refused in one line."""
import os

import pytest
import torch

from protege.errors import UserFacingError
from protege.runtime.launch import launched, resolve_processes


def gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_auto_is_one_rank_per_gpu_under_deepspeed(monkeypatch):
    gpus(monkeypatch, 4)
    assert resolve_processes("auto", "deepspeed", "auto", "rl") == 4
    assert resolve_processes("auto", "torch", "auto", "rl") == 1  # the torch backend trains in one process
    assert resolve_processes("auto", "deepspeed", "cpu", "rl") == 1
    gpus(monkeypatch, 0)
    assert resolve_processes("auto", "deepspeed", "auto", "rl") == 1


def test_a_number_is_taken_and_impossible_ones_are_refused(monkeypatch):
    gpus(monkeypatch, 0)
    assert resolve_processes(2, "deepspeed", "cpu", "sft") == 2  # gloo ranks on the CPU
    with pytest.raises(UserFacingError, match="sft.processes is 2, but sft.backend 'torch' trains in one process"):
        resolve_processes(2, "torch", "cpu", "sft")
    gpus(monkeypatch, 2)
    with pytest.raises(UserFacingError, match="rl.processes is 4, but this machine shows 2 GPU"):
        resolve_processes(4, "deepspeed", "cuda", "rl")


def test_a_launched_rank_is_recognised(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert not launched()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launched()


class Section:
    def __init__(self, nodes=1, rdzv_endpoint=None, max_restarts=0, backend="deepspeed"):
        self.nodes, self.rdzv_endpoint, self.max_restarts, self.backend = nodes, rdzv_endpoint, max_restarts, backend


@pytest.fixture
def no_node_env(monkeypatch):
    for name in ("PROTEGE_NODES", "PROTEGE_NODE_RANK", "PROTEGE_RDZV_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_nodes_come_from_the_command_line_then_the_environment_then_the_section(no_node_env):
    from protege.runtime.launch import Nodes, resolve_nodes

    assert resolve_nodes(Section(), "rl") == Nodes(1, 0, None, 0)
    assert resolve_nodes(Section(2, "h0:29400", 1), "rl") == Nodes(2, 0, "h0:29400", 1)
    no_node_env.setenv("PROTEGE_NODES", "3")
    no_node_env.setenv("PROTEGE_NODE_RANK", "2")
    no_node_env.setenv("PROTEGE_RDZV_ENDPOINT", "pod-0.svc:29400")
    assert resolve_nodes(Section(), "rl") == Nodes(3, 2, "pod-0.svc:29400", 0)  # a pod's values
    assert resolve_nodes(Section(), "rl", 2, 1, "10.0.0.1:1234") == Nodes(2, 1, "10.0.0.1:1234", 0)


def test_impossible_node_settings_are_refused_in_one_line(no_node_env):
    from protege.runtime.launch import resolve_nodes

    with pytest.raises(UserFacingError, match="rl: 2 nodes need a rendezvous endpoint"):
        resolve_nodes(Section(2), "rl")
    with pytest.raises(UserFacingError, match="rl: 2 nodes train under DeepSpeed; set rl.backend: deepspeed"):
        resolve_nodes(Section(2, "h:1", backend="torch"), "rl")
    with pytest.raises(UserFacingError, match=r"node rank 2 is outside 0..1"):
        resolve_nodes(Section(2, "h:1"), "rl", node_rank=2)
    with pytest.raises(UserFacingError, match="--rdzv-endpoint is 'node0'; expected HOST:PORT"):
        resolve_nodes(Section(), "rl", 2, 0, "node0")
    no_node_env.setenv("PROTEGE_NODES", "1")  # a one-pod job for a section that asks for two nodes
    with pytest.raises(UserFacingError, match=r"agent.rl.nodes is 2, but this job runs on 1 node\(s\)"):
        resolve_nodes(Section(2, "h:1"), "agent.rl")
    no_node_env.setenv("PROTEGE_NODES", "two")
    with pytest.raises(UserFacingError, match="PROTEGE_NODES is 'two'; expected a whole number"):
        resolve_nodes(Section(), "rl")


def test_ranks_are_numbered_by_node_rank_not_rendezvous_order(monkeypatch):
    """The agents' rendezvous may put node 1 first; the ranks take node rank x local world + local rank."""
    from protege.runtime.launch import join_node_ranks

    monkeypatch.setenv("RANK", "0")  # the rendezvous' numbering
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("PROTEGE_NODE_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    join_node_ranks()
    assert os.environ["RANK"] == "5"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")  # rank 0 would host the store: left alone
    join_node_ranks()
    assert os.environ["RANK"] == "0"
