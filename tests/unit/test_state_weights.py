"""A training state's weights leave the frozen parameters out (they are the checkpoint the run starts from):
a LoRA run saves its adapters, not the base, and loads them back exactly; a state that lacks a trained
tensor, or holds another model's, is refused."""
import copy

import pytest
import torch

from protege.models.lora import add_lora
from protege.runtime.state import Weights
from protege.runtime.updaters import TorchUpdater


def lora_updater(student):
    model = add_lora(copy.deepcopy(student), rank=2, alpha=4, dropout=0.0, target_modules="auto")
    params = [p for p in model.parameters() if p.requires_grad]
    return model, TorchUpdater(model, params, lr=1e-3)


def test_a_lora_state_holds_the_adapters_and_loads_them_back(tiny_student):
    model, updater = lora_updater(tiny_student)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.5)  # "trained"
    tensors, _ = Weights(updater).dump()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(tensors) == trained and all(".lora_" in k for k in tensors)
    full = sum(v.numel() for v in model.state_dict().values())
    assert sum(v.numel() for v in tensors.values()) < full / 10

    again, again_updater = lora_updater(tiny_student)  # fresh adapters on the same base
    Weights(again_updater).load(tensors, None)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in again.state_dict().items())


def test_a_state_missing_a_trained_tensor_or_holding_another_models_is_refused(tiny_student):
    model, updater = lora_updater(tiny_student)
    tensors, _ = Weights(updater).dump()
    missing = dict(tensors)
    missing.pop(next(iter(missing)))
    with pytest.raises(RuntimeError, match="does not fit this model: missing"):
        Weights(updater).load(missing, None)
    with pytest.raises(RuntimeError, match="unexpected"):
        Weights(updater).load({**tensors, "not.a.weight": torch.zeros(1)}, None)


def test_a_module_trained_by_no_updater_keeps_every_tensor(tiny_student):
    head = torch.nn.Linear(4, 1)
    tensors, _ = Weights(head).dump()
    assert set(tensors) == {"weight", "bias"}


class Counting:
    """A part that counts its dumps."""

    def __init__(self, per_rank: bool, source=None):
        self.per_rank, self.source, self.dumps = per_rank, source, 0

    def dump(self):
        self.dumps += 1
        return {"x": torch.ones(2)}, None


class ZeroThree:
    zero_stage = 3


def test_only_rank_0_copies_a_whole_part_unless_its_dump_is_collective(tmp_path):
    """Rank 1 dumps its own pieces and joins ZeRO-3's gather, but makes no host copy of a whole part that
    rank 0 alone writes (at 7B, ~15 GB of host memory per rank per save)."""
    import random

    from protege.runtime.state import save_state

    whole, mine, gathered = Counting(False), Counting(True), Counting(False, ZeroThree())
    (tmp_path / "state.tmp").mkdir()
    save_state(tmp_path / "state", step=1, parts={"w": whole, "rng": mine, "z3": gathered}, py_rng=random.Random(0),
               cursor={}, fingerprint="f", rank=1, world_size=2)
    assert (whole.dumps, mine.dumps, gathered.dumps) == (0, 1, 1)
    assert (tmp_path / "state.tmp" / "rng-rank1.safetensors").exists()
    assert not (tmp_path / "state.tmp" / "w.safetensors").exists()


def test_a_gpu_load_reads_the_weights_onto_the_device():
    """On a GPU the weights go straight from the safetensors files to the device (no host copy of the whole
    model per rank); on the CPU from_pretrained is called as before."""
    from protege.models.student import placement

    assert placement(torch.device("cuda", 3)) == {"device_map": {"": "cuda:3"}}
    assert placement(torch.device("cpu")) == {} and placement(None) == {}
