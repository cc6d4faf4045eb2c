"""How many ranks a stage starts: `auto` follows the visible GPUs under DeepSpeed (a Kubernetes job given 4 GPUs
runs 4 ranks), a number is taken as it is, and what cannot run is refused in one line."""
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
