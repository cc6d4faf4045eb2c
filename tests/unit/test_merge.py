import pytest
import torch
from safetensors.torch import load_file, save_file

from protege.merging.uniform import average_state_dicts, merge_uniform


def test_average_matches_closed_form():
    states = [{"w": torch.tensor([1.0, 2.0]), "step": torch.tensor(3)},
              {"w": torch.tensor([3.0, 6.0]), "step": torch.tensor(5)},
              {"w": torch.tensor([5.0, 1.0]), "step": torch.tensor(7)}]
    out = average_state_dicts(states)
    assert torch.allclose(out["w"], torch.tensor([3.0, 3.0]))
    assert out["step"].item() == 3  # integer buffers are not averaged


def test_mismatched_tensors_fail():
    with pytest.raises(ValueError, match="different tensors"):
        average_state_dicts([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])


def test_merge_folders(tmp_path):
    dirs = []
    for i in range(2):
        d = tmp_path / f"step-{i}"
        d.mkdir()
        save_file({"w": torch.full((2,), float(i))}, str(d / "model.safetensors"), metadata={"format": "pt"})
        (d / "config.json").write_text("{}")
        dirs.append(d)
    out = merge_uniform(dirs, tmp_path / "merged")
    assert torch.allclose(load_file(str(out / "model.safetensors"))["w"], torch.full((2,), 0.5))
    assert (out / "config.json").exists()
    with pytest.raises(ValueError, match="nothing to merge"):
        merge_uniform([], tmp_path / "x")
