"""The merge stage: the configured method over the RL checkpoints (task vectors from the SFT checkpoint),
closed forms on real checkpoints, a mergekit YAML as merge.config, and bad settings."""
import pytest
import torch
from safetensors.torch import load_file

from protege.config import Config
from protege.errors import UserFacingError
from protege.merging.config import MergeConfigError
from protege.models.student import save_student
from protege.stages import merge as merge_stage
from protege.tracking import QuietRun


@pytest.fixture
def project(tmp_path, tiny_student, tiny_processor):
    save_student(tiny_student, tiny_processor, tmp_path / "models/sft")
    g = torch.Generator().manual_seed(0)
    for step in (10, 20, 30):
        with torch.no_grad():
            for p in tiny_student.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
        save_student(tiny_student, tiny_processor, tmp_path / f"models/rl/step-{step:05d}")
    return tmp_path


def tensors(root, rel):
    return load_file(str(root / rel / "model.safetensors"))


def run_merge(root, **merge):
    cfg = Config.model_validate({"merge": merge})
    merge_stage.run(cfg, root, QuietRun())
    return tensors(root, "models/merged")


def test_uniform_is_the_mean(project):
    out = run_merge(project)
    cs = [tensors(project, f"models/rl/step-{s:05d}") for s in (10, 20, 30)]
    for k in out:
        if out[k].is_floating_point():
            assert torch.allclose(out[k], (cs[0][k] + cs[1][k] + cs[2][k]) / 3, atol=1e-6), k


def test_task_arithmetic_from_the_sft_checkpoint(project):
    out = run_merge(project, method="task_arithmetic", parameters={"weight": 1.0, "lambda": 0.5})
    base = tensors(project, "models/sft")
    cs = [tensors(project, f"models/rl/step-{s:05d}") for s in (10, 20, 30)]
    k = next(n for n in out if "q_proj.weight" in n)
    expected = base[k] + 0.5 * sum(c[k] - base[k] for c in cs)
    assert torch.allclose(out[k], expected, atol=1e-6)


def test_slerp_goes_towards_the_last_checkpoint(project):
    out = run_merge(project, method="slerp", parameters={"t": 0.0})
    base = tensors(project, "models/sft")
    k = next(n for n in out if "q_proj.weight" in n)
    assert torch.allclose(out[k], base[k], atol=1e-6)  # t = 0: the base itself


def test_mergekit_yaml_as_merge_config(project):
    (project / "soup.yaml").write_text("merge_method: ties\nparameters: {density: 0.5, weight: 1.0}\n"
                                       "dtype: float32\nmodels: [{model: ignored}]\n")
    out = run_merge(project, config="soup.yaml")
    assert (project / "models/merged/merge_config.yaml").exists()
    base = tensors(project, "models/sft")
    k = next(n for n in out if "q_proj.weight" in n)
    assert not torch.equal(out[k], base[k])


def test_bad_settings(project):
    with pytest.raises(MergeConfigError, match="density"):
        run_merge(project, method="ties", parameters={"density": 1.5, "weight": 1.0})
    (project / "bad.yaml").write_text("merge_method: frankenmerge\n")
    with pytest.raises(MergeConfigError, match="frankenmerge"):
        run_merge(project, config="bad.yaml")
    (project / "twice.yaml").write_text("merge_method: ties\nmerge_method: linear\n")
    with pytest.raises(UserFacingError, match="twice.yaml:2"):  # a key given twice names the file and line
        run_merge(project, config="twice.yaml")
    (project / "sliced.yaml").write_text("merge_method: slerp\nslices: [{sources: [{model: a, layer_range: [0, 2]}]}]\n")
    with pytest.raises(UserFacingError, match="sliced.yaml: slices: the merge stage soups"):
        run_merge(project, config="sliced.yaml")
    with pytest.raises(UserFacingError, match="merge.config: missing.yaml is not a file"):
        run_merge(project, config="missing.yaml")
    with pytest.raises(ValueError, match="relative to the project"):
        Config.model_validate({"merge": {"config": "/etc/passwd"}})
