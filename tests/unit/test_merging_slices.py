"""mergekit's slices: form: layer ranges, per-slice / per-source parameters, gradients over a slice's layers,
filters, passthrough frankenmerges (layer renumbering, config.json's layer count), a VLM's text decoder, and
every bad slice's message."""
import json

import pytest
import torch
import yaml

from protege.merging import merge_folders, methods as M
from protege.merging.config import MergeConfigError, load_config
from protege.merging.io import Checkpoint
from protege.models.layer_names import LayoutError, decoder_stack, is_post_weight, split_layer_name

transformers = pytest.importorskip("transformers")
TINY = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """4-layer Qwen2 models: base, and a / b = base + noise (every tensor differs, norms included)."""
    root = tmp_path_factory.mktemp("slices")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY))
    model.save_pretrained(root / "base")
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = {"base": root / "base"}
    for seed, name in ((1, "a"), (2, "b")):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(base[n] + 0.05 * torch.randn(p.shape, generator=g))
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


def sd(folder):
    ck = Checkpoint(folder)
    return {n: ck.get(n) for n in ck.names()}


def write(tmp_path, data, name="merge.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def src(path, a, b, **params):
    return {"model": str(path), "layer_range": [a, b], **({"parameters": params} if params else {})}


# ------------------------------------------------------------------ frankenmerge

def test_passthrough_frankenmerge_renumbers_layers(tmp_path, ckpts):
    cfg = write(tmp_path, {"merge_method": "passthrough", "slices": [
        {"sources": [src(ckpts["a"], 0, 3)]},
        {"sources": [src(ckpts["b"], 1, 4, scale=[{"filter": "o_proj", "value": 0.5}, {"value": 1.0}])]}]})
    merge_folders(cfg, tmp_path / "out", max_shard_bytes=20_000)
    got = sd(tmp_path / "out")
    a, b = sd(ckpts["a"]), sd(ckpts["b"])
    layer = [n[len("model.layers.0."):] for n in a if n.startswith("model.layers.0.")]
    assert len(layer) == 12
    assert set(got) == {f"model.layers.{j}.{s}" for j in range(6) for s in layer} | {
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for s in layer:
        for j in range(3):  # output layers 0-2 = a's layers 0-2
            assert torch.equal(got[f"model.layers.{j}.{s}"], a[f"model.layers.{j}.{s}"])
        for k in range(3):  # output layers 3-5 = b's layers 1-3, o_proj scaled by 0.5
            want = b[f"model.layers.{1 + k}.{s}"] * (0.5 if "o_proj" in s else 1.0)
            assert torch.equal(got[f"model.layers.{3 + k}.{s}"], want), s
    # embeddings from the first slice's model, final norm and lm_head from the last slice's
    assert torch.equal(got["model.embed_tokens.weight"], a["model.embed_tokens.weight"])
    assert torch.equal(got["model.norm.weight"], b["model.norm.weight"])
    assert torch.equal(got["lm_head.weight"], b["lm_head.weight"])
    conf = json.loads((tmp_path / "out" / "config.json").read_text())
    assert conf["num_hidden_layers"] == 6 and conf["layer_types"] == ["full_attention"] * 6
    assert len(list((tmp_path / "out").glob("model-*.safetensors"))) >= 2  # sharded, written out of file order
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert len(model.model.layers) == 6
    assert torch.equal(model.state_dict()["model.layers.4.mlp.up_proj.weight"], b["model.layers.2.mlp.up_proj.weight"])


# ------------------------------------------------------------------ precedence, gradients, pre / post weights

def test_task_arithmetic_slices_precedence_and_gradients(tmp_path, ckpts):
    """source > slice > top-level parameters; a gradient runs over the slice's output layers; the weights
    before the layers take slices[0]'s sources and parameters, those after take the last slice's."""
    cfg = write(tmp_path, {
        "merge_method": "task_arithmetic", "base_model": str(ckpts["base"]), "parameters": {"weight": 0.1},
        "slices": [
            {"sources": [src(ckpts["a"], 0, 3, weight=[0, 1]), src(ckpts["base"], 0, 3)],
             "parameters": {"lambda": 2.0}},
            {"sources": [src(ckpts["b"], 2, 4), src(ckpts["base"], 1, 3)],
             "parameters": {"weight": [{"filter": "mlp", "value": 3.0}]}}]})
    merge_folders(cfg, tmp_path / "out")
    got, a, b, base = sd(tmp_path / "out"), sd(ckpts["a"]), sd(ckpts["b"]), sd(ckpts["base"])
    L = "model.layers.{}.{}"
    for s in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
        # slice 0: 3 output layers at t = 0, 0.5, 1 -> weight 0, 0.5, 1 (a's own gradient), lambda 2 (slice)
        for j, w in enumerate((0.0, 0.5, 1.0)):
            want = base[L.format(j, s)] + 2.0 * w * (a[L.format(j, s)] - base[L.format(j, s)])
            assert torch.allclose(got[L.format(j, s)], want, atol=1e-6), (j, s)
        # slice 1: output layers 3, 4 = b's layers 2, 3 over base's layers 1, 2; weight 3 for mlp (slice's
        # filter), else nothing matched there: the top-level 0.1; lambda back to the default 1
        w = 3.0 if "mlp" in s else 0.1
        for k in range(2):
            want = base[L.format(1 + k, s)] + w * (b[L.format(2 + k, s)] - base[L.format(1 + k, s)])
            assert torch.allclose(got[L.format(3 + k, s)], want, atol=1e-6), (k, s)
    # pre: t = 0 -> a's weight 0: the base's embeddings; post: slice 1's sources, weight 0.1, lambda 1
    assert torch.allclose(got["model.embed_tokens.weight"], base["model.embed_tokens.weight"], atol=1e-7)
    for n in ("model.norm.weight", "lm_head.weight"):
        assert torch.allclose(got[n], base[n] + 0.1 * (b[n] - base[n]), atol=1e-6), n
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"] == 5


def test_slerp_classic_filters_and_gradients(tmp_path, ckpts):
    """mergekit's README slerp: t lists interpolated over the slice's 4 output layers (t_k = k/3)."""
    cfg = write(tmp_path, {
        "merge_method": "slerp", "base_model": str(ckpts["base"]),
        "slices": [{"sources": [src(ckpts["base"], 0, 4), src(ckpts["a"], 0, 4)]}],
        "parameters": {"t": [{"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
                             {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]}, {"value": 0.5}]}})
    c = load_config(cfg)
    out = c.slices[0]
    # x = 4k/3: k=1 -> 2/3 * 0.5 + 1/3 * 0.3; k=2 -> 1/3 * 0.3 + 2/3 * 0.7 (self_attn), mirrored for mlp
    want_attn = [0.0, 2 / 3 * 0.5 + 1 / 3 * 0.3, 1 / 3 * 0.3 + 2 / 3 * 0.7, 1.0]
    want_mlp = [1.0, 2 / 3 * 0.5 + 1 / 3 * 0.7, 1 / 3 * 0.7 + 2 / 3 * 0.3, 0.0]
    merge_folders(cfg, tmp_path / "out")
    got, a, base = sd(tmp_path / "out"), sd(ckpts["a"]), sd(ckpts["base"])
    for k in range(4):
        for s, want in (("self_attn.k_proj.weight", want_attn[k]), ("mlp.up_proj.weight", want_mlp[k]),
                        ("input_layernorm.weight", 0.5)):
            n = f"model.layers.{k}.{s}"
            t = c.resolve_slice(out, [out.sources[1]], n, [n], k / 3)[0]["t"]
            assert t == pytest.approx(want), (k, s)
            assert torch.allclose(got[n], M.slerp(want, base[n], a[n]), atol=1e-6), n
    n = "model.embed_tokens.weight"  # outside the layers: t = 0, no filter matches -> 0.5
    assert torch.allclose(got[n], M.slerp(0.5, base[n], a[n]), atol=1e-6)


def test_per_source_filters_match_the_source_layer_name(tmp_path, ckpts):
    """mergekit matches a per-source filter against that source's own tensor name (its layer index), and a
    shared parameter's filter against the output name."""
    data = {"merge_method": "task_arithmetic", "base_model": str(ckpts["base"]),
            "slices": [{"sources": [src(ckpts["a"], 2, 4, weight=[{"filter": "layers.3.", "value": 7.0},
                                                                   {"value": 1.0}]),
                                    src(ckpts["base"], 2, 4)],
                        "parameters": {"lambda": [{"filter": "layers.1.", "value": 0.5}, {"value": 1.0}]}}]}
    cfg = load_config(write(tmp_path, data))
    out = cfg.slices[0]
    # output layer 1 reads a's layer 3: the source filter "layers.3." matches, the shared "layers.1." too
    shared, per_model = cfg.resolve_slice(out, [out.sources[0]], "model.layers.1.mlp.up_proj.weight",
                                          ["model.layers.3.mlp.up_proj.weight"], 1.0)
    assert per_model == [{"weight": 7.0, "density": 1.0}] and shared["lambda"] == 0.5
    shared, per_model = cfg.resolve_slice(out, [out.sources[0]], "model.layers.0.mlp.up_proj.weight",
                                          ["model.layers.2.mlp.up_proj.weight"], 0.0)
    assert per_model == [{"weight": 1.0, "density": 1.0}] and shared["lambda"] == 1.0


# ------------------------------------------------------------------ a VLM: only the text decoder is sliced

def _qwen2_vl(seed):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=1),
        vision_config=dict(depth=2, embed_dim=16, hidden_size=16, num_heads=2))
    return transformers.Qwen2VLForConditionalGeneration(cfg)


def test_vlm_slices_the_text_decoder_only(tmp_path):
    for seed, name in ((0, "A"), (1, "B")):
        _qwen2_vl(seed).save_pretrained(tmp_path / name)
    A, B = sd(tmp_path / "A"), sd(tmp_path / "B")
    assert "visual.blocks.1.attn.qkv.weight" in A and "model.layers.2.mlp.up_proj.weight" in A
    cfg = write(tmp_path, {"merge_method": "passthrough", "slices": [
        {"sources": [src(tmp_path / "A", 0, 2)]}, {"sources": [src(tmp_path / "B", 1, 3)]}]})
    merge_folders(cfg, tmp_path / "out")
    got = sd(tmp_path / "out")
    assert torch.equal(got["model.layers.3.mlp.up_proj.weight"], B["model.layers.2.mlp.up_proj.weight"])
    assert torch.equal(got["model.layers.1.self_attn.q_proj.bias"], A["model.layers.1.self_attn.q_proj.bias"])
    # the vision tower and its merger come whole from the first slice's model; norm and lm_head from the last's
    for n in A:
        if n.startswith("visual."):
            assert torch.equal(got[n], A[n]), n
    assert torch.equal(got["model.norm.weight"], B["model.norm.weight"])
    assert not any(n.startswith("model.layers.4.") for n in got)
    conf = json.loads((tmp_path / "out" / "config.json").read_text())
    assert conf["text_config"]["num_hidden_layers"] == 4 and len(conf["text_config"]["layer_types"]) == 4
    assert conf["vision_config"]["depth"] == 2
    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "out")
    assert len(model.model.language_model.layers) == 4 and len(model.model.visual.blocks) == 2


@pytest.mark.parametrize("names, config, want", [
    (["model.layers.0.x", "model.layers.1.x", "visual.blocks.0.x", "visual.blocks.1.x", "visual.blocks.2.x"],
     None, ("model.layers.", 2)),
    (["model.language_model.layers.0.x", "model.vision_tower.vision_model.encoder.layers.5.x"], None,
     ("model.language_model.layers.", 1)),
    (["transformer.h.0.attn.w", "transformer.h.11.attn.w", "transformer.wte.weight"], None, ("transformer.h.", 12)),
    (["encoder.block.0.x", "encoder.block.1.x", "decoder.block.0.x", "decoder.block.1.x", "decoder.block.2.x"],
     {"num_hidden_layers": 3}, ("decoder.block.", 3)),
    (["model.layers.0.mlp.experts.7.w1.weight", "model.layers.3.mlp.experts.0.w1.weight"], None,
     ("model.layers.", 4)),
])
def test_decoder_stack(names, config, want):
    assert decoder_stack(names, config) == want


def test_decoder_stack_errors_and_post_weights():
    with pytest.raises(LayoutError, match=r"several layer stacks could be the text decoder: encoder.block.<i> "
                                          r"\(2 layers\), decoder.block.<i> \(2 layers\)"):
        decoder_stack(["encoder.block.1.x", "decoder.block.1.x"], {"num_hidden_layers": 5})
    with pytest.raises(LayoutError, match=r"no decoder layers found: expected tensor names such as "
                                          r"model.layers.<i>. \(only visual.blocks., which look like vision"):
        decoder_stack(["visual.blocks.0.x", "lm_head.weight"])
    post = {n: is_post_weight(n, p) for n, p in [
        ("model.norm.weight", "model.layers."), ("lm_head.weight", "model.layers."),
        ("model.embed_tokens.weight", "model.layers."), ("model.embedding_norm.weight", "model.layers."),
        ("transformer.ln_f.bias", "transformer.h."), ("transformer.wte.weight", "transformer.h."),
        ("visual.merger.ln_q.weight", "model.layers."), ("output.weight", "model.layers."),
        ("model.language_model.norm.weight", "model.language_model.layers."),
        ("gpt_neox.final_layer_norm.weight", "gpt_neox.layers."), ("embed_out.weight", "gpt_neox.layers.")]}
    assert [n for n, v in post.items() if v] == [
        "model.norm.weight", "lm_head.weight", "transformer.ln_f.bias", "output.weight",
        "model.language_model.norm.weight", "gpt_neox.final_layer_norm.weight", "embed_out.weight"]
    ln = split_layer_name("model.layers.12.mlp.experts.3.w1.weight")
    assert (ln.prefix, ln.index, ln.suffix) == ("model.layers.", 12, "mlp.experts.3.w1.weight")
    assert ln.renumbered(0) == "model.layers.0.mlp.experts.3.w1.weight"


# ------------------------------------------------------------------ bad slices

def fails(tmp_path, data, message):
    p = write(tmp_path, data)
    with pytest.raises(MergeConfigError) as err:
        load_config(p)
    assert str(err.value) == f"{p}: {message}", str(err.value)


@pytest.fixture
def dirs(tmp_path):
    out = {}
    for name in ("base", "a", "b"):
        (tmp_path / name).mkdir()
        out[name] = tmp_path / name
    return out


def test_bad_slices_name_the_key(tmp_path, dirs):
    d = dirs

    def ties(*slices, **top):
        return {"merge_method": "ties", "base_model": str(d["base"]), "parameters": {"weight": 1.0},
                "slices": list(slices), **top}

    ok = {"sources": [src(d["a"], 0, 2), src(d["base"], 0, 2)]}
    fails(tmp_path, ties(ok, {"sources": [src(d["a"], 3, 3), src(d["base"], 0, 2)]}),
          "slices[1].sources[0].layer_range: expected [start, end] with 0 <= start < end (the layers start .. end-1),"
          " got [3, 3]")
    fails(tmp_path, ties({"sources": [{"model": str(d["a"]), "layer_range": [0]}]}),
          "slices[0].sources[0].layer_range: expected [start, end], two whole numbers (the layers start .. end-1), "
          "got [0]")
    fails(tmp_path, ties({"sources": [{"model": str(d["a"])}]}),
          "slices[0].sources[0].layer_range: missing: expected [start, end], the layers start .. end-1 of the model")
    fails(tmp_path, ties({"sources": [src(d["a"], 0, 3), src(d["base"], 0, 2)]}),
          "slices[0].sources[1].layer_range: [0, 2] has 2 layers but slices[0].sources[0] has 3; every source of a "
          "slice gives one input per output layer, so all need the same number of layers")
    fails(tmp_path, ties({**ok, "parameters": {"density": []}}),
          "slices[0].parameters.density: empty list; expected a number, a gradient list of numbers, or a list of "
          "{filter, value} entries")
    fails(tmp_path, ties(ok, {**ok, "parameters": {"density": [{"filter": "mlp", "value": []}]}}),
          "slices[1].parameters.density[0].value: empty list; expected a number or a gradient list of numbers")
    bad = {"sources": [src(d["a"], 0, 2, weight=[{"filter": 3, "value": 1.0}]), src(d["base"], 0, 2)]}
    fails(tmp_path, ties(bad), "slices[0].sources[0].parameters.weight[0].filter: expected a string (a substring of "
                               "tensor names), got 3")
    bad = {"sources": [src(d["a"], 0, 2, weight=[{"filter": "mlp", "value": {"value": 1}}]), src(d["base"], 0, 2)]}
    fails(tmp_path, ties(bad), "slices[0].sources[0].parameters.weight[0].value: a filter entry's value must be a "
                               "number or a gradient list, not another filter entry")
    bad = {"sources": [src(d["a"], 0, 2, weight=[{"filter": "mlp", "value": "heavy"}]), src(d["base"], 0, 2)]}
    fails(tmp_path, ties(bad), "slices[0].sources[0].parameters.weight[0].value: expected a number, got 'heavy'")
    bad = {"sources": [src(d["a"], 0, 2, normalize=False), src(d["base"], 0, 2)]}
    fails(tmp_path, ties(bad), "slices[0].sources[0].parameters.normalize: normalize is shared by the slice's "
                               "sources: put it under the slice's or the top-level parameters:")
    fails(tmp_path, ties({"sources": [src(d["a"], 0, 2), src(d["b"], 0, 2)]}),
          f"slices[0].sources: ties takes the base_model's layers from the slice's sources, but {d['base']} is not "
          f"among them (add it with its layer_range, as mergekit requires)")
    fails(tmp_path, ties({"sources": [src(d["a"], 0, 2), src(d["a"], 2, 4)]}),
          f"slices[0].sources[1].model: {d['a']} is already slices[0].sources[0]")
    fails(tmp_path, ties({**ok, "residual_weight": 0.5}),
          "slices[0].residual_weight: not supported (mergekit 0.1.5 reads it but never uses it); remove it")
    fails(tmp_path, ties(ok, models=[{"model": str(d["a"])}]),
          "slices: give models: or slices:, not both (mergekit takes exactly one of them)")
    no_weight = ties(ok)
    no_weight["parameters"] = {}
    fails(tmp_path, no_weight, "slices[0].sources[0].parameters.weight: missing: ties needs weight for every "
                               "non-base source (set it here, under the slice's parameters: or the top-level "
                               "parameters:)")
    fails(tmp_path, {"merge_method": "passthrough", "slices": [{"sources": [src(d["a"], 0, 2), src(d["b"], 0, 2)]}]},
          "slices[0].sources: passthrough merges exactly 1 source per slice, got 2 (passthrough copies one source "
          "per slice: stack layers with one slice per range)")
    slerp = {"merge_method": "slerp", "base_model": str(d["base"]), "slices": [
        {"sources": [src(d["base"], 0, 2), src(d["a"], 0, 2)], "parameters": {"t": 0.5}},
        {"sources": [src(d["base"], 2, 4), src(d["a"], 2, 4)]}]}
    fails(tmp_path, slerp, "slices[1].parameters.t: missing: slerp needs t under the slice's or the top-level "
                           "parameters:")
    slerp["slices"][1]["parameters"] = {"t": None}
    fails(tmp_path, slerp, "slices[1].parameters.t: no value; expected a number, a gradient list of numbers, or a "
                           "list of {filter, value} entries")


def test_layer_range_beyond_the_model_fails_before_writing(tmp_path, ckpts):
    cfg = write(tmp_path, {"merge_method": "passthrough", "slices": [
        {"sources": [src(ckpts["a"], 0, 2)]}, {"sources": [src(ckpts["b"], 2, 6)]}]})
    with pytest.raises(MergeConfigError) as err:
        merge_folders(cfg, tmp_path / "out")
    assert str(err.value) == (f"{cfg}: slices[1].sources[0].layer_range: [2, 6] goes beyond the 4 layers of "
                              f"{ckpts['b'].resolve()} (model.layers.0 .. model.layers.3); expected 0 <= start < "
                              f"end <= 4")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
