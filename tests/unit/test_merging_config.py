"""mergekit-style merge configs: filters, gradients across layers, and every bad input's message."""
import pytest
import yaml

from protege.errors import UserFacingError
from protege.merging.config import MergeConfigError, layer_positions, load_config


@pytest.fixture
def models(tmp_path):
    out = {}
    for name in ("base", "a", "b", "c"):
        (tmp_path / name).mkdir()
        out[name] = str(tmp_path / name)
    return out


def write(tmp_path, data, name="merge.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def ties_cfg(paths, **over):
    data = {"merge_method": "ties", "base_model": paths["base"],
            "models": [{"model": paths["a"], "parameters": {"weight": 1.0, "density": 0.5}},
                       {"model": paths["b"], "parameters": {"weight": 0.5}}],
            "parameters": {"density": 0.8}}
    data.update(over)
    return data


def fails(tmp_path, data, message):
    p = write(tmp_path, data)
    with pytest.raises(MergeConfigError) as err:
        load_config(p)
    assert str(err.value) == f"{p}: {message}", str(err.value)
    assert isinstance(err.value, UserFacingError)


# ------------------------------------------------------------------ resolution

def test_per_model_then_top_level_then_default(tmp_path, models):
    cfg = load_config(write(tmp_path, ties_cfg(models)))
    shared, per_model = cfg.resolve("model.layers.0.mlp.up_proj.weight", 0.0)
    assert shared == {"int8_mask": False, "normalize": True, "rescale": False, "lambda": 1.0}
    assert per_model == [{"weight": 1.0, "density": 0.5}, {"weight": 0.5, "density": 0.8}]
    assert [m.key for m in cfg.merged] == ["models[0]", "models[1]"]
    assert cfg.reference.key == "base_model" and cfg.tokenizer_folder == cfg.base.path


def test_filters_first_match_wins_substring(tmp_path, models):
    data = ties_cfg(models)
    data["models"][0]["parameters"]["density"] = [
        {"filter": "self_attn", "value": 0.3},
        {"filter": "q_proj", "value": 0.9},       # never reached for q_proj: self_attn matched first
        {"filter": "mlp", "value": [0.2, 0.6]},  # a gradient inside a filter
        {"value": 0.7}]
    data["models"][1]["parameters"]["density"] = [{"filter": "lm_head", "value": 0.1}]  # no default entry
    data["parameters"]["lambda"] = [{"filter": "*", "value": 2}]
    cfg = load_config(write(tmp_path, data))
    r = lambda name, t=0.0: cfg.resolve(name, t)  # noqa: E731
    assert r("model.layers.1.self_attn.q_proj.weight")[1][0]["density"] == 0.3
    assert r("model.layers.1.mlp.up_proj.weight", 0.5)[1][0]["density"] == pytest.approx(0.4)
    assert r("model.norm.weight")[1][0]["density"] == 0.7
    assert r("lm_head.weight")[1][1]["density"] == 0.1
    # nothing matched for models[1]: falls through to the top-level parameters
    assert r("model.norm.weight")[1][1]["density"] == 0.8
    assert r("model.norm.weight")[0]["lambda"] == 2.0
    # a single {filter, value} mapping (not in a list) is one filter entry
    data["models"][1]["parameters"]["density"] = {"filter": "norm", "value": 0.25}
    cfg = load_config(write(tmp_path, data))
    assert cfg.resolve("model.norm.weight", 0)[1][1]["density"] == 0.25
    assert cfg.resolve("model.embed_tokens.weight", 0)[1][1]["density"] == 0.8


def test_gradient_across_layers(tmp_path, models):
    data = ties_cfg(models)
    data["models"][0]["parameters"]["weight"] = [1, 3, 2]
    data["parameters"]["normalize"] = [True, False]   # booleans are picked, not interpolated
    cfg = load_config(write(tmp_path, data))
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(5)] + [
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    pos = layer_positions(names)
    assert [pos[n] for n in names] == [0, 0.25, 0.5, 0.75, 1.0, 0, 0, 0]
    # x = t*(3-1): t=.25 -> 1 + .5*(3-1) = 2; t=.5 -> 3; t=.75 -> 3 + .5*(2-3) = 2.5; t=1 -> 2
    got = [cfg.resolve(n, pos[n])[1][0]["weight"] for n in names]
    assert got == pytest.approx([1, 2, 3, 2.5, 2, 1, 1, 1])
    assert [cfg.resolve(n, pos[n])[0]["normalize"] for n in names[:5]] == [True, True, True, True, False]


def test_layer_positions_per_stack():
    names = ["model.layers.0.x", "model.layers.1.x", "model.layers.2.x", "model.visual.blocks.0.attn.w",
             "model.visual.blocks.1.attn.w", "transformer.h.0.w", "bert.encoder.layer.0.w",
             "model.visual.merger.mlp.0.weight", "model.norm.weight"]
    pos = layer_positions(names)
    assert [pos[n] for n in names] == [0, 0.5, 1, 0, 1, 1.0, 1.0, 0, 0]  # a 1-layer stack: t = 1 (as mergekit)


def test_numbers_from_strings_and_tokenizer_source(tmp_path, models):
    data = ties_cfg(models, tokenizer_source=models["c"])
    data["models"][1]["parameters"]["density"] = "1e-1"   # PyYAML reads 1e-1 as a string; mergekit takes it
    cfg = load_config(write(tmp_path, data))
    assert cfg.resolve("x", 0)[1][1]["density"] == pytest.approx(0.1)
    assert str(cfg.tokenizer_folder).endswith("/c") and str(cfg.donor).endswith("/base")
    cfg = load_config(write(tmp_path, ties_cfg(models, tokenizer_source="base")))
    assert cfg.tokenizer_folder == cfg.base.path
    lin = {"merge_method": "linear", "models": [{"model": models["a"]}, {"model": models["b"]}],
           "parameters": {"weight": 1}, "dtype": "torch.bfloat16", "out_dtype": "float16"}
    cfg = load_config(write(tmp_path, lin))
    assert str(cfg.donor).endswith("/a") and cfg.base is None and cfg.dtype_name == "bfloat16"
    assert cfg.out_dtype_name == "float16"


def test_base_listed_among_models_and_relative_paths(tmp_path, models, monkeypatch):
    data = ties_cfg(models)
    data["models"].insert(0, {"model": models["base"]})  # the base listed too: not merged, needs no weight
    cfg = load_config(write(tmp_path, data))
    assert [m.key for m in cfg.merged] == ["models[1]", "models[2]"]
    assert len(cfg.inputs) == 3
    # linear + base_model not listed: mergekit adds the base as an input (with the top-level weight)
    lin = {"merge_method": "linear", "base_model": models["base"], "models": [{"model": models["a"]}],
           "parameters": {"weight": 2}}
    cfg = load_config(write(tmp_path, lin))
    assert [m.key for m in cfg.merged] == ["models[0]", "base_model"]
    # paths relative to the config's folder when not found from the current one
    sub = tmp_path / "cfgs"
    sub.mkdir()
    monkeypatch.chdir(sub)
    rel = {"merge_method": "linear", "models": [{"model": "../a", "parameters": {"weight": 1}}, "../b"],
           "parameters": {"weight": 3}}
    cfg = load_config(write(tmp_path, rel))
    assert [m.path.name for m in cfg.models] == ["a", "b"]


# ------------------------------------------------------------------ errors

def test_errors_name_the_file_and_key(tmp_path, models):
    m = models
    bad = lambda **kw: ties_cfg(m, **kw)  # noqa: E731

    d = bad()
    d["models"][1]["parameters"]["density"] = 1.5
    fails(tmp_path, d, "models[1].parameters.density: expected a number in (0, 1], got 1.5")
    d = bad()
    d["models"][0]["parameters"]["density"] = 0
    fails(tmp_path, d, "models[0].parameters.density: expected a number in (0, 1], got 0")
    d = bad()
    d["models"][0]["parameters"]["density"] = [0.5, 1.2]
    fails(tmp_path, d, "models[0].parameters.density[1]: expected a number in (0, 1], got 1.2")
    d = bad()
    d["models"][0]["parameters"]["density"] = [{"filter": "mlp", "value": 2}]
    fails(tmp_path, d, "models[0].parameters.density[0].value: expected a number in (0, 1], got 2")
    d = bad()
    d["models"][0]["parameters"]["gamma"] = 1
    fails(tmp_path, d, "models[0].parameters.gamma: expected a number in [0, 1), got 1")
    d = bad()
    d["models"][0]["parameters"]["weight"] = "heavy"
    fails(tmp_path, d, "models[0].parameters.weight: expected a number, got 'heavy'")
    d = bad()
    d["models"][0]["parameters"]["weight"] = True
    fails(tmp_path, d, "models[0].parameters.weight: expected a number, got True")
    d = bad()
    d["models"][0]["parameters"]["desnity"] = 0.5
    fails(tmp_path, d, "models[0].parameters.desnity: unknown parameter for ties (it takes: density, int8_mask, "
                       "lambda, normalize, rescale, weight)")
    d = bad()
    d["models"][0]["parameters"]["normalize"] = True
    fails(tmp_path, d, "models[0].parameters.normalize: normalize is set once for the whole merge: put it under "
                       "the top-level parameters:")
    d = bad()
    d["parameters"]["normalize"] = "yes please"
    fails(tmp_path, d, "parameters.normalize: expected true or false, got 'yes please'")
    d = bad()
    d["models"][0]["parameters"]["density"] = [{"filter": "mlp"}]
    fails(tmp_path, d, "models[0].parameters.density[0]: a filter entry needs value:")
    d = bad()
    d["models"][0]["parameters"]["density"] = [{"filter": "mlp", "value": 0.5, "vaule": 1}]
    fails(tmp_path, d, "models[0].parameters.density[0].vaule: unknown key in a filter entry (expected filter and "
                       "value)")
    d = bad()
    d["models"][0]["parameters"]["density"] = [0.5, {"value": 0.5}]
    fails(tmp_path, d, "models[0].parameters.density: a list must be all numbers (a gradient) or all "
                       "{filter, value} entries")
    d = bad()
    d["models"][0]["parameters"]["density"] = []
    fails(tmp_path, d, "models[0].parameters.density: empty list; expected a number, a gradient list of numbers, "
                       "or a list of {filter, value} entries")
    d = bad()
    del d["models"][1]["parameters"]["weight"]
    fails(tmp_path, d, "models[1].parameters.weight: missing: ties needs weight for every non-base model (set it "
                       "here or under the top-level parameters:)")

    fails(tmp_path, bad(merge_method="frankenmerge"), "merge_method: unknown method 'frankenmerge'; expected one of "
          "breadcrumbs, breadcrumbs_ties, dare_linear, dare_ties, linear, model_stock, passthrough, slerp, "
          "task_arithmetic, ties")
    d = bad()
    del d["merge_method"]
    fails(tmp_path, d, "merge_method: missing; expected one of breadcrumbs, breadcrumbs_ties, dare_linear, "
                       "dare_ties, linear, model_stock, passthrough, slerp, task_arithmetic, ties")
    d = bad()
    del d["base_model"]
    fails(tmp_path, d, "base_model: ties needs a base_model (the model the task vectors are taken from)")
    fails(tmp_path, bad(base_model=str(tmp_path / "nowhere")), f"base_model: {tmp_path / 'nowhere'} does not exist "
          "(protege merge reads local model folders only; LoRA references and hub ids are not fetched)")
    d = bad()
    d["models"][1]["model"] = str(tmp_path / "missing")
    fails(tmp_path, d, f"models[1].model: {tmp_path / 'missing'} does not exist (protege merge reads local model "
                       "folders only; LoRA references and hub ids are not fetched)")
    (tmp_path / "file.txt").write_text("x")
    d = bad()
    d["models"][1]["model"] = str(tmp_path / "file.txt")
    fails(tmp_path, d, f"models[1].model: {tmp_path / 'file.txt'} is not a folder")
    d = bad()
    d["models"][1]["model"] = m["a"]
    fails(tmp_path, d, f"models[1].model: {tmp_path / 'a'} is already models[0]")
    d = bad()
    del d["models"][1]["model"]
    fails(tmp_path, d, "models[1].model: missing: the model folder")
    d = bad()
    d["models"][1]["weight"] = 1
    fails(tmp_path, d, "models[1].weight: unknown key (a model entry has model: and parameters:)")
    fails(tmp_path, bad(models=[]), "models: missing or empty: list the models to merge (each as `- model: PATH`), "
                                    "or layer ranges under slices:")
    fails(tmp_path, bad(slices=[{"sources": []}]), "slices: give models: or slices:, not both (mergekit takes "
                                                   "exactly one of them)")
    fails(tmp_path, bad(modules={"text_decoder": {}}), "modules: modules are not supported; list whole models under "
                                                       "models: or layer ranges under slices:")
    fails(tmp_path, bad(tokenizer={"source": "union"}), "tokenizer: tokenizer surgery (tokenizer:) is not supported; "
                                                        "use tokenizer_source: base or a model folder")
    fails(tmp_path, bad(name="my-merge"), "name: not supported by protege merge (supported keys: merge_method, "
                                          "models, slices, base_model, parameters, dtype, out_dtype, "
                                          "tokenizer_source)")
    fails(tmp_path, bad(tokenizer_source="union"), "tokenizer_source: union (merging vocabularies) is not supported; "
                                                   "use base or a model folder")
    fails(tmp_path, bad(dtype="fp8"), "dtype: unknown dtype 'fp8'; expected one of bfloat16, float16, float32, "
                                      "float64")
    fails(tmp_path, bad(out_dtype="int8"), "out_dtype: unknown dtype 'int8'; expected one of bfloat16, float16, "
                                           "float32, float64")
    lin = {"merge_method": "linear", "models": [{"model": m["a"]}], "tokenizer_source": "base",
           "parameters": {"weight": 1}}
    fails(tmp_path, lin, "tokenizer_source: base, but there is no base_model")
    lin = {"merge_method": "linear", "base_model": m["base"], "models": [{"model": m["a"], "parameters":
                                                                           {"weight": 1}}]}
    fails(tmp_path, lin, "parameters.weight: missing: linear merges the base_model too (mergekit adds it to the "
                         "inputs), so give it a weight under the top-level parameters: or list it under models: "
                         "with its own")


def test_method_shape_errors(tmp_path, models):
    m = models
    slerp = {"merge_method": "slerp", "base_model": m["base"], "models": [{"model": m["a"]}, {"model": m["b"]}],
             "parameters": {"t": 0.5}}
    fails(tmp_path, slerp, "models: slerp merges exactly 2 models counting the base_model, got 3 (slerp: the "
                           "base_model and one other model)")
    slerp["models"] = [{"model": m["a"]}]
    slerp["parameters"] = {}
    fails(tmp_path, slerp, "parameters.t: missing: slerp needs t under the top-level parameters:")
    slerp["parameters"] = {"t": 1.5}
    fails(tmp_path, slerp, "parameters.t: expected a number in [0, 1], got 1.5")
    stock = {"merge_method": "model_stock", "base_model": m["base"], "models": [{"model": m["a"]}]}
    fails(tmp_path, stock, "models: model_stock merges at least 3 models counting the base_model, got 2")
    ta = {"merge_method": "task_arithmetic", "base_model": m["base"], "models": [{"model": m["base"]}]}
    fails(tmp_path, ta, "models: task_arithmetic needs at least one model besides the base_model")


def test_yaml_errors(tmp_path, models):
    p = write(tmp_path, "merge_method: ties\nmerge_method: linear\n")
    with pytest.raises(MergeConfigError, match=r"merge.yaml: not valid YAML \(line 2\): key 'merge_method' given "
                                               r"twice"):
        load_config(p)
    p = write(tmp_path, "models: [a\n")
    with pytest.raises(MergeConfigError, match="merge.yaml: not valid YAML"):
        load_config(p)
    p = write(tmp_path, "- just a list\n")
    with pytest.raises(MergeConfigError, match="merge.yaml: expected a mapping with merge_method and models"):
        load_config(p)
    with pytest.raises(MergeConfigError, match="nope.yaml: no such file"):
        load_config(tmp_path / "nope.yaml")


def test_resolve_errors(tmp_path, models):
    data = ties_cfg(models)
    data["models"][1]["parameters"]["weight"] = [{"filter": "mlp", "value": 1}]
    cfg = load_config(write(tmp_path, data))
    with pytest.raises(MergeConfigError, match=r"merge.yaml: models\[1\].parameters.weight: ties needs weight for "
                                               r".*/b .*nothing matched tensor model.norm.weight"):
        cfg.resolve("model.norm.weight", 0)
    lin = {"merge_method": "linear", "models": [{"model": models["a"], "parameters": {"weight": 1}},
                                                {"model": models["b"], "parameters": {"weight": -1}}]}
    cfg = load_config(write(tmp_path, lin))
    with pytest.raises(MergeConfigError, match=r"merge.yaml: parameters.normalize: the weights for tensor w sum to "
                                               r"0, so normalize: true cannot divide by them"):
        cfg.resolve("w", 0)
