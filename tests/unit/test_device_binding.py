"""Each rank binds its own GPU before any collective, whoever launched it: NCCL (and `on_rank0`'s object
broadcast) stage on the current CUDA device, so an unbound rank would put every rank on GPU 0. torch.cuda and
torch.distributed are replaced by recorders: the order of the calls is what is checked."""
import datetime
import types

import pytest
import torch

from protege.errors import UserFacingError
from protege.runtime import launch
from protege.runtime.distributed import on_rank0
from protege.runtime.placement import rank_gpu, resolve_device

# what each launcher puts in a rank's environment (rank 3 of 8 on one 8-GPU machine)
LAUNCHERS = {
    "protege": {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    "torchrun": {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "0",
                 "ROLE_RANK": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                 "TORCHELASTIC_RUN_ID": "none"},
    "deepspeed": {"RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "CROSS_RANK": "0", "CROSS_SIZE": "1",
                  "LOCAL_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    "mpirun": {"RANK": "3", "WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29500"},
}
RANK_VARS = {v for env in LAUNCHERS.values() for v in env} | {"PROTEGE_EXIT_WITH_PARENT"}


class Recorder:
    """torch.cuda with `gpus` devices and a torch.distributed group, recording what is called in which order."""

    def __init__(self, monkeypatch, gpus: int = 8):
        self.calls: list[tuple] = []
        self.current = 0
        self.grouped = False
        cuda, dist = torch.cuda, torch.distributed
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(dist, "is_initialized", lambda: self.grouped)
        monkeypatch.setattr(dist, "init_process_group", self.init_process_group)
        monkeypatch.setattr(dist, "broadcast_object_list", self.broadcast_object_list)

    def set_device(self, device):
        self.current = torch.device(device).index
        self.calls.append(("set_device", self.current))

    def init_process_group(self, backend, **kw):
        self.grouped = True
        self.calls.append(("init_process_group", backend, kw.get("device_id"), kw.get("timeout"), self.current))

    def broadcast_object_list(self, box, src=0):
        self.calls.append(("broadcast_object_list", self.current))


@pytest.fixture
def clean_env(monkeypatch):
    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_gpu_is_bound_before_the_group_is_made(clean_env, launcher):
    for k, v in LAUNCHERS[launcher].items():
        clean_env.setenv(k, v)
    rec = Recorder(clean_env)
    launch.init_group(on_cuda=True, timeout_s=600)
    assert rec.calls[0] == ("set_device", 3)
    backend, device_id, timeout, current = rec.calls[1][1:]
    assert (backend, device_id, current) == ("nccl", torch.device("cuda", 3), 3)
    assert timeout == datetime.timedelta(seconds=600)
    # the first collective of a stage (rank 0 prepares, the others receive) then stages on the rank's own GPU
    on_rank0(lambda: "prepared")
    assert rec.calls[-1] == ("broadcast_object_list", 3)


def test_the_stage_command_binds_before_the_stage_runs(clean_env, tmp_path):
    """`protege stage rl` as a launched rank: binding and the group come before the stage's first collective."""
    from protege import cli

    for k, v in LAUNCHERS["torchrun"].items():
        clean_env.setenv(k, v)
    rec = Recorder(clean_env)
    clean_env.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("rl: {device: cuda, backend: deepspeed, processes: 8,"
                                          " collective_timeout_s: 120}\n")
    stage = types.SimpleNamespace(run=lambda cfg, root, run: on_rank0(lambda: None))
    clean_env.setattr("protege.stages.stage_module", lambda name: stage)
    clean_env.setattr("protege.plan.check_stage_fits", lambda *a, **k: "")
    cli.stage("rl", params=tmp_path / "params.yaml")
    names = [c[0] for c in rec.calls]
    assert names == ["set_device", "init_process_group", "broadcast_object_list"]
    assert rec.calls[1][2:4] == (torch.device("cuda", 3), datetime.timedelta(seconds=120))
    assert rec.calls[2] == ("broadcast_object_list", 3)


def test_a_cpu_rank_joins_gloo_without_touching_cuda(clean_env):
    for k, v in LAUNCHERS["protege"].items():
        clean_env.setenv(k, v)
    rec = Recorder(clean_env)
    launch.init_group(on_cuda=False, timeout_s=60)
    assert rec.calls == [("init_process_group", "gloo", None, datetime.timedelta(seconds=60), 0)]


def test_one_gpu_shown_per_process_is_index_0(clean_env):
    # a scheduler that sets CUDA_VISIBLE_DEVICES per rank: local rank 3 sees one GPU, which is cuda:0
    for k, v in LAUNCHERS["torchrun"].items():
        clean_env.setenv(k, v)
    Recorder(clean_env, gpus=1)
    assert rank_gpu() == torch.device("cuda", 0)
    assert resolve_device("cuda", "rl.device") == torch.device("cuda", 0)


def test_more_local_ranks_than_gpus_or_no_local_rank_is_refused(clean_env):
    for k, v in LAUNCHERS["torchrun"].items():
        clean_env.setenv(k, v)
    Recorder(clean_env, gpus=2)
    with pytest.raises(UserFacingError, match="local rank 3 but sees 2 GPU"):
        rank_gpu()
    clean_env.delenv("LOCAL_RANK")
    with pytest.raises(UserFacingError, match="set LOCAL_RANK"):
        rank_gpu()
