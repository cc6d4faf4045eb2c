"""`protege merge` on real (tiny) transformers checkpoints: the output loads with from_pretrained and equals the
closed form; bad inputs fail before anything is written."""
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from protege.cli import app
from protege.merging import merge_folders
from protege.merging.config import MergeConfigError
from protege.merging.io import Checkpoint

transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def _model(seed, **over):
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**TINY, **over}))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for i, name in enumerate(("base", "a", "b")):
        kw = {"max_shard_size": "20KB"} if name == "b" else {}  # b is sharded
        _model(i).save_pretrained(root / name, **kw)
        out[name] = root / name
    (out["base"] / "tokenizer_config.json").write_text('{"from": "base"}')
    (out["a"] / "tokenizer_config.json").write_text('{"from": "a"}')
    (out["a"] / "special_tokens_map.json").write_text("{}")
    assert (out["b"] / "model.safetensors.index.json").exists()
    return out


def sd(folder):
    ck = Checkpoint(folder)
    return {n: ck.get(n) for n in ck.names()}


def run(cfg_path, out, *args):
    res = CliRunner().invoke(app, ["merge", str(cfg_path), str(out), *args])
    return res.exit_code, res.output if hasattr(res, "output") else "", res.stderr


def write_cfg(tmp_path, data):
    p = tmp_path / "merge.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_linear_sharded_output_loads_and_matches(tmp_path, ckpts):
    cfg = write_cfg(tmp_path, {"merge_method": "linear", "models": [
        {"model": str(ckpts["a"]), "parameters": {"weight": 1.0}},
        {"model": str(ckpts["b"]), "parameters": {"weight": 2.0}},
        {"model": str(ckpts["base"]), "parameters": {"weight": 1.0}}]})
    out = tmp_path / "out"
    code, stdout, stderr = run(cfg, out, "--max-shard-size", "8KB")
    assert code == 0, stderr
    assert "merge: 27/27 tensors" in stderr and "merge: 1/27 tensors" in stderr
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in files and sum(f.startswith("model-0") for f in files) >= 3
    assert {"config.json", "generation_config.json", "tokenizer_config.json", "merge_config.yaml"} <= set(files)
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"from": "a"}  # donor: the first model
    assert not list(tmp_path.glob(".out.partial-*"))
    a, b, base = sd(ckpts["a"]), sd(ckpts["b"]), sd(ckpts["base"])
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    got = model.state_dict()
    assert set(got) == set(a)
    for n in a:
        assert torch.allclose(got[n], (a[n] + 2 * b[n] + base[n]) / 4, atol=1e-6), n
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(a)
    assert all(p.stat().st_size <= 8000 + 4096 for p in out.glob("model-*.safetensors"))  # + header


def test_task_arithmetic_gradient_and_out_dtype(tmp_path, ckpts):
    cfg = write_cfg(tmp_path, {"merge_method": "task_arithmetic", "base_model": str(ckpts["base"]),
                               "out_dtype": "bfloat16", "tokenizer_source": str(ckpts["a"]),
                               "models": [{"model": str(ckpts["a"]), "parameters": {"weight": [0.2, 0.8]}},
                                          {"model": str(ckpts["b"]), "parameters": {"weight": 0.5}}],
                               "parameters": {"lambda": 2.0}})
    out = tmp_path / "out"
    code, _, stderr = run(cfg, out)
    assert code == 0, stderr
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"from": "a"}
    assert (out / "special_tokens_map.json").exists()
    a, b, base = sd(ckpts["a"]), sd(ckpts["b"]), sd(ckpts["base"])
    got = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).state_dict()
    for n in a:
        # weight of a: 0.2 at layer 0 (t=0), 0.8 at layer 1 (t=1), 0.2 outside the layers (t=0)
        wa = 0.8 if n.startswith("model.layers.1.") else 0.2
        want = base[n] + 2.0 * (wa * (a[n] - base[n]) + 0.5 * (b[n] - base[n]))
        assert got[n].dtype == torch.bfloat16
        assert torch.allclose(got[n].float(), want.to(torch.bfloat16).float(), atol=1e-2, rtol=0), n


def test_dare_is_reproducible_per_seed(tmp_path, ckpts):
    data = {"merge_method": "dare_ties", "base_model": str(ckpts["base"]),
            "models": [{"model": str(ckpts["a"]), "parameters": {"weight": 1.0, "density": 0.5}},
                       {"model": str(ckpts["b"]), "parameters": {"weight": 1.0, "density": 0.5}}]}
    cfg = write_cfg(tmp_path, data)
    before = {n: (ckpts[n] / "model.safetensors").read_bytes() for n in ("base", "a")}
    merge_folders(cfg, tmp_path / "s1", seed=1)
    # inputs are read through copy-on-write mappings and updated in place: the files must not change
    assert all((ckpts[n] / "model.safetensors").read_bytes() == before[n] for n in before)
    merge_folders(cfg, tmp_path / "s1bis", seed=1)
    merge_folders(cfg, tmp_path / "s2", seed=2)
    one, again, two = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("s1", "s1bis", "s2"))
    assert all(torch.equal(one[n], again[n]) for n in one)
    assert any(not torch.equal(one[n], two[n]) for n in one)


def test_out_dir_exists_and_overwrite(tmp_path, ckpts):
    cfg = write_cfg(tmp_path, {"merge_method": "linear", "parameters": {"weight": 1},
                               "models": [{"model": str(ckpts["a"])}, {"model": str(ckpts["base"])}]})
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("x")
    code, _, stderr = run(cfg, out)
    assert code == 1 and stderr.strip() == f"error: {out}: already exists; remove it or pass --overwrite"
    code, _, stderr = run(cfg, out, "--overwrite")
    assert code == 0, stderr
    assert not (out / "old.txt").exists() and (out / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.fixture
def bad_ckpts(tmp_path, ckpts):
    wide = tmp_path / "wide"
    _model(5, intermediate_size=40).save_pretrained(wide)
    holey = tmp_path / "holey"
    holey.mkdir()
    state = sd(ckpts["a"])
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(holey / "model.safetensors"), metadata={"format": "pt"})
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    return {"wide": wide, "holey": holey, "pickled": pickled}


@pytest.mark.parametrize("which, message", [
    ("wide", "models[2] ({p}): tensor model.layers.0.mlp.down_proj.weight has shape [16, 40], base has [16, 32]"),
    ("holey", "models[2] ({p}): tensor model.layers.1.mlp.up_proj.weight is missing (base has it)"),
    ("pickled", "models[2]: {p}: no model.safetensors or model.safetensors.index.json (found: pytorch_model.bin; "
                "pickled .bin/.pt weights are never read)"),
])
def test_incompatible_models_fail_before_writing(tmp_path, ckpts, bad_ckpts, which, message):
    p = bad_ckpts[which]
    cfg = write_cfg(tmp_path, {"merge_method": "ties", "base_model": str(ckpts["base"]), "models": [
        {"model": str(ckpts["a"]), "parameters": {"weight": 1}}, {"model": str(ckpts["b"]), "parameters":
                                                                   {"weight": 1}},
        {"model": str(p), "parameters": {"weight": 1}}]})
    out = tmp_path / "out"
    code, _, stderr = run(cfg, out)
    assert code == 1
    assert stderr.strip() == f"error: {cfg}: " + message.format(p=p.resolve())
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_extra_tensor_and_bad_config(tmp_path, ckpts):
    extra = tmp_path / "extra"
    extra.mkdir()
    state = sd(ckpts["a"])
    state["model.extra.weight"] = torch.zeros(2)
    save_file(state, str(extra / "model.safetensors"))
    cfg = write_cfg(tmp_path, {"merge_method": "linear", "parameters": {"weight": 1},
                               "models": [{"model": str(ckpts["a"])}, {"model": str(extra)}]})
    code, _, stderr = run(cfg, tmp_path / "out")
    assert code == 1 and stderr.strip() == (f"error: {cfg}: models[1] ({extra.resolve()}): tensor model.extra.weight "
                                            f"is not in models[0]")
    cfg = write_cfg(tmp_path, {"merge_method": "ties", "base_model": str(ckpts["base"]),
                               "models": [{"model": str(ckpts["a"]), "parameters": {"weight": 1, "density": 1.5}}]})
    code, _, stderr = run(cfg, tmp_path / "out")
    assert code == 1
    assert stderr.strip() == f"error: {cfg}: models[0].parameters.density: expected a number in (0, 1], got 1.5"
    code, _, stderr = run(cfg, tmp_path / "out", "--max-shard-size", "lots")
    assert code == 1 and "--max-shard-size: not a size: 'lots'" in stderr
    assert not (tmp_path / "out").exists()


def test_failure_midway_leaves_nothing(tmp_path, ckpts):
    cfg = write_cfg(tmp_path, {"merge_method": "linear", "parameters": {"weight": 1},
                               "models": [{"model": str(ckpts["a"])}, {"model": str(ckpts["b"])}]})

    def progress(done, total, name):
        if done == 5:
            raise MergeConfigError("stop")

    with pytest.raises(MergeConfigError, match="stop"):
        merge_folders(cfg, tmp_path / "deep" / "out", progress=progress, max_shard_bytes=4000)
    assert list((tmp_path / "deep").iterdir()) == []


def test_int_buffers_take_the_base(tmp_path):
    folders = []
    for i in range(3):
        d = tmp_path / f"m{i}"
        d.mkdir()
        save_file({"w": torch.full((3,), float(i)), "pos": torch.arange(3) + 10 * i}, str(d / "model.safetensors"))
        folders.append(d)
    cfg = write_cfg(tmp_path, {"merge_method": "task_arithmetic", "base_model": str(folders[1]), "models": [
        {"model": str(folders[0]), "parameters": {"weight": 1}}, {"model": str(folders[2]), "parameters":
                                                                   {"weight": 1}}]})
    merge_folders(cfg, tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert torch.equal(got["pos"], torch.arange(3) + 10)   # the base's
    assert torch.equal(got["w"], torch.full((3,), 1.0))    # 1 + (0-1) + (2-1)


def test_truncated_shard_and_unwritable_output(tmp_path, ckpts):
    cut = tmp_path / "cut"
    cut.mkdir()
    data = (ckpts["a"] / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:-100])
    cfg = write_cfg(tmp_path, {"merge_method": "linear", "parameters": {"weight": 1},
                               "models": [{"model": str(ckpts["base"])}, {"model": str(cut)}]})
    code, _, stderr = run(cfg, tmp_path / "out")
    assert code == 1
    assert stderr.strip() == (f"error: {cfg}: models[1]: {cut.resolve() / 'model.safetensors'}: truncated "
                              f"({len(data) - 100} bytes, its header needs {len(data)})")
    assert not (tmp_path / "out").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = write_cfg(tmp_path, {"merge_method": "linear", "parameters": {"weight": 1},
                               "models": [{"model": str(ckpts["base"])}, {"model": str(ckpts["a"])}]})
    code, _, stderr = run(cfg, blocker / "out")
    assert code == 1 and stderr.startswith(f"error: {blocker / 'out'}: cannot create the output next to it:")
