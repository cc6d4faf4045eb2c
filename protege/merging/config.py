"""mergekit-style merge configs (the `models:` and `slices:` forms), validated, and their parameters resolved
per tensor.

Accepted YAML (mergekit 0.1.5's MergeConfiguration minus modules/tokenizer surgery)::

    merge_method: ties                # see protege.merging.methods.METHODS
    base_model: ./ckpt/base           # needed by every method but linear and passthrough
    models:
      - model: ./ckpt/a
        parameters: {weight: 0.5, density: 0.6}
      - model: ./ckpt/b
        parameters:
          weight: [0.2, 0.8]          # a gradient across the layers
          density:
            - {filter: self_attn, value: 0.5}
            - value: 0.8              # no filter: the default
    parameters: {normalize: true}     # shared parameters; per-model defaults
    dtype: float32                    # arithmetic dtype (default float32)
    out_dtype: bfloat16               # written dtype (default: dtype if given, else the base's)
    tokenizer_source: base            # base | a model folder | absent (= base, else the first model)

or, instead of models:, output slices (layer ranges; a frankenmerge with passthrough)::

    slices:
      - sources:                      # each source gives one input per output layer of the slice
          - model: ./ckpt/a
            layer_range: [0, 16]      # [start, end): layers start .. end-1 of that model
            parameters: {weight: 1.0} # per-source parameters
          - model: ./ckpt/base
            layer_range: [0, 16]
        parameters: {t: [0, 0.5, 1]}  # per-slice parameters
        base_model: ./ckpt/base       # optional, else the top-level base_model

Resolution follows mergekit (mergekit/config.py `evaluate_setting` and `ConfigReader.parameter_sources`,
mergekit/parameter_resolver.py, mergekit/plan.py):
- a per-model parameter is looked up in the model's (or slice source's) `parameters:`, then the slice's
  `parameters:`, then the top-level `parameters:`, then the method's default; a shared parameter (normalize,
  lambda, t, ...) in the slice's and then the top-level `parameters:` only;
- a list of `{filter, value}` entries: the FIRST entry whose filter is a substring of the tensor name (or has no
  filter, or filter "*") wins; when none matches the lookup falls through to the next level. Per-model
  parameters match the input's tensor name (a source's own layer index), shared ones the output's;
- a list of numbers is a gradient: with t in [0, 1] the tensor's position, x = t (n - 1), i = floor(x),
  value = (1 - (x - i)) v[i] + (x - i) v[min(i + 1, n - 1)] (booleans: v[int(t (n - 1))]);
- models: form: t of a tensor in layer i of a stack of L layers is i / (L - 1) (1 when L = 1); every tensor
  outside the layer stacks (embeddings, final norm, lm_head, ...) has t = 0, as mergekit plans pre- and
  post-weights. protege knows no architecture tables (see protege.models.layer_names): each distinct layer prefix
  (e.g. the text decoder's `model.layers.` and a vision tower's `visual.blocks.`) is its own stack whose L is its
  largest index + 1 in the reference model;
- slices: form: output layer k of a slice of n layers has t = k / (n - 1) (1 when n = 1), whichever layers of
  the sources it comes from; the other tensors have t = 0 (protege.merging.plan says which inputs they take).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from protege.errors import UserFacingError
from protege.models.layer_names import layer_stacks, split_layer_name
from protege.merging.methods import METHODS, REQUIRED, MethodInfo

SUPPORTED_KEYS = ("merge_method", "models", "slices", "base_model", "parameters", "dtype", "out_dtype",
                  "tokenizer_source")
UNSUPPORTED_HINT = {
    "modules": "modules are not supported; list whole models under models: or layer ranges under slices:",
    "tokenizer": "tokenizer surgery (tokenizer:) is not supported; use tokenizer_source: base or a model folder",
    "chat_template": "chat_template is not supported; edit the output's tokenizer_config.json instead",
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
FLOAT_PARAMS = ("weight", "density", "gamma", "lambda", "t", "epsilon", "scale")
BOOL_PARAMS = ("normalize", "rescale", "int8_mask", "filter_wise")
# parameters some mergekit method takes: accepted (and ignored) by methods that do not use them, as mergekit does
KNOWN_PARAMS = set(FLOAT_PARAMS) | set(BOOL_PARAMS)
SETTING_FORMS = "a number, a gradient list of numbers, or a list of {filter, value} entries"
MODEL_SHARED_RULE = "is set once for the whole merge: put it under the top-level parameters:"


class MergeConfigError(UserFacingError):
    """A merge config (or its inputs) that cannot be used; the message names the file and the key."""


def _range_check(name: str, x: float) -> str | None:
    if not math.isfinite(x):
        return "a finite number"
    if name == "density" and not 0 < x <= 1:
        return "a number in (0, 1]"
    if name == "gamma" and not 0 <= x < 1:
        return "a number in [0, 1)"
    if name == "t" and not 0 <= x <= 1:
        return "a number in [0, 1]"
    if name == "epsilon" and not 0 <= x < 1:
        return "a number in [0, 1)"
    return None


@dataclass(frozen=True)
class ModelInput:
    """One model folder of the merge. `key` names it in errors: models[i], slices[i].sources[j] or base_model."""
    path: Path
    key: str
    parameters: dict = field(default_factory=dict)
    is_base: bool = False

    @property
    def label(self) -> str:
        return f"{self.key} ({self.path})"


@dataclass(frozen=True)
class SliceSource:
    """One source of an output slice: layers start .. end-1 of a model, with its own parameters."""
    model: ModelInput
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class OutputSlice:
    """slices[i]: its sources (all of one length), its parameters, and its base (the slice's base_model, else the
    top-level one; None when the method takes no base)."""
    key: str
    sources: tuple[SliceSource, ...]
    parameters: dict
    base: Path | None

    @property
    def length(self) -> int:
        return self.sources[0].length


@dataclass
class MergeConfig:
    source: str                 # the config file, as named in errors
    method: str
    info: MethodInfo
    models: list[ModelInput]    # as listed under models: (slices: every distinct source model, first use)
    base: ModelInput | None     # the base_model (one of `models` when listed there)
    parameters: dict            # top-level parameters (validated, unresolved)
    dtype: torch.dtype | None
    out_dtype: torch.dtype | None
    dtype_name: str | None
    out_dtype_name: str | None
    donor: Path                 # folder whose non-weight files (config.json, ...) are copied
    tokenizer_folder: Path      # folder whose tokenizer / processor files are copied
    text: str = ""              # the YAML as read
    slices: list[OutputSlice] | None = None  # the slices: form; None for the models: form

    def error(self, key: str, message: str) -> MergeConfigError:
        return MergeConfigError(f"{self.source}: {key}: {message}")

    @property
    def inputs(self) -> list[ModelInput]:
        """mergekit's input order: the listed models, then the base_model when it is not listed. slices: every
        distinct source model (a base outside every slice is never read)."""
        if self.slices is None and self.base is not None and not any(m.is_base for m in self.models):
            return [*self.models, self.base]
        return list(self.models)

    @property
    def merged(self) -> list[ModelInput]:
        """The inputs `merge_tensor` takes as `tensors`: every input for linear, the non-base ones otherwise."""
        if self.info.needs_base:
            return [m for m in self.inputs if not m.is_base]
        return self.inputs

    @property
    def reference(self) -> ModelInput:
        """The model whose tensor names, shapes and dtypes the others must match: the base, else models[0]."""
        return self.base if self.base is not None else self.models[0]

    def resolve(self, tensor_name: str, t: float) -> tuple[dict, list[dict]]:
        """models: form. (shared parameters, one dict of per-model parameters per `merged` input) for one tensor,
        numbers and booleans only. Raises MergeConfigError when a required parameter has no value for it."""
        inputs = [(m, tensor_name, (m.parameters, self.parameters)) for m in self.merged]
        return self._resolve(tensor_name, t, (self.parameters,), inputs, where_shared="the top-level parameters:",
                             where_model="the model's parameters: or the top-level parameters:")

    def resolve_slice(self, out_slice: OutputSlice, sources: list[SliceSource], out_name: str,
                      in_names: list[str], t: float) -> tuple[dict, list[dict]]:
        """slices: form. As `resolve`, for one output tensor of `out_slice` whose merged inputs are `sources`
        (tensor `in_names[k]` of sources[k]): source, then slice, then top-level parameters."""
        shared_scopes = (out_slice.parameters, self.parameters)
        inputs = [(s.model, name, (s.model.parameters, *shared_scopes)) for s, name in zip(sources, in_names)]
        return self._resolve(out_name, t, shared_scopes, inputs,
                             where_shared="the slice's or the top-level parameters:",
                             where_model="the source's parameters:, the slice's parameters: or the top-level "
                                         "parameters:")

    def _resolve(self, out_name: str, t: float, shared_scopes: tuple[dict, ...],
                 inputs: list[tuple[ModelInput, str, tuple[dict, ...]]], where_shared: str,
                 where_model: str) -> tuple[dict, list[dict]]:
        shared = {}
        for key, default in self.info.shared.items():
            value = _lookup(key, shared_scopes, out_name, t, default)
            if value is REQUIRED:
                raise self.error(f"parameters.{key}", f"{self.method} needs {key} (set it under {where_shared}); "
                                                      f"nothing matched tensor {out_name}")
            shared[key] = value
        per_model = []
        for model, in_name, scopes in inputs:
            row = {}
            for key, default in self.info.per_model.items():
                value = _lookup(key, scopes, in_name, t, default)
                if value is REQUIRED:
                    raise self.error(f"{model.key}.parameters.{key}",
                                     f"{self.method} needs {key} for {model.path} (set it under {where_model}); "
                                     f"nothing matched tensor {in_name}")
                row[key] = value
            per_model.append(row)
        if self.method == "linear" and shared.get("normalize") and sum(r["weight"] for r in per_model) == 0:
            raise self.error("parameters.normalize", f"the weights for tensor {out_name} sum to 0, so "
                                                     f"normalize: true cannot divide by them")
        return shared, per_model


# ------------------------------------------------------------------------------------------- evaluation

def _lookup(key: str, scopes: tuple[dict, ...], tensor_name: str, t: float, default):
    """The first scope whose setting for `key` yields a value (a filter list may match nothing), else default."""
    for params in scopes:
        value = _evaluate(params.get(key), tensor_name, t)
        if value is not None:
            return value
    return default


def _evaluate(setting: Any, tensor_name: str, t: float):
    """mergekit's evaluate_setting on an already validated setting; None = no value here."""
    if setting is None:
        return None
    if isinstance(setting, dict):
        setting = [setting]
    if isinstance(setting, bool) or isinstance(setting, (int, float)):
        return setting
    if isinstance(setting, list):
        if all(not isinstance(e, dict) for e in setting):
            if all(isinstance(e, bool) for e in setting):
                return setting[int(t * (len(setting) - 1))]
            scaled = t * (len(setting) - 1)
            i0 = int(scaled)
            i1 = min(len(setting) - 1, i0 + 1)
            frac = scaled - i0
            return (1 - frac) * setting[i0] + frac * setting[i1]
        for cond in setting:
            flt = cond.get("filter")
            if flt is None or flt == "*" or (tensor_name and flt in tensor_name):
                return _evaluate(cond["value"], tensor_name, t)
        return None
    raise AssertionError(setting)


def layer_positions(names) -> dict[str, float]:
    """t in [0, 1] of every tensor name (see the module docstring): i / (L - 1) in a layer stack, else 0."""
    found = {name: split_layer_name(name) for name in names}
    counts = layer_stacks(names)
    out = {}
    for name, ln in found.items():
        if ln is None:
            out[name] = 0.0
        else:
            n = counts[ln.prefix]
            out[name] = ln.index / (n - 1) if n > 1 else 1.0
    return out


# ------------------------------------------------------------------------------------------- loading

class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader (as mergekit reads configs), except that a key given twice is an error."""


def _mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (str, int, float, bool)):
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


class _Checker:
    def __init__(self, source: str, method: str, info: MethodInfo):
        self.source, self.method, self.info = source, method, info

    def fail(self, key: str, message: str):
        raise MergeConfigError(f"{self.source}: {key}: {message}")

    def scalar(self, name: str, key: str, value):
        if name in BOOL_PARAMS:
            if not isinstance(value, bool):
                self.fail(key, f"expected true or false, got {value!r}")
            return value
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string; mergekit's validation takes it
            try:
                value = float(value)
            except ValueError:
                self.fail(key, f"expected a number, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {value!r}")
        value = float(value)
        want = _range_check(name, value)
        if want:
            self.fail(key, f"expected {want}, got {value:g}")
        return value

    def setting(self, name: str, key: str, value, nested: bool = False):
        """Validates (and normalises) a parameter setting: scalar, gradient list, or filter entries."""
        if isinstance(value, dict):
            return self.setting(name, key, [value], nested)[0] if not nested else self.fail(
                key, "a filter entry's value must be a number or a gradient list, not another filter entry")
        if isinstance(value, list):
            if not value:  # mergekit would skip it silently (evaluate_setting returns None)
                self.fail(key, "empty list; expected " + ("a number or a gradient list of numbers" if nested
                                                          else SETTING_FORMS))
            if all(isinstance(e, dict) for e in value):
                if nested:
                    self.fail(key, "a filter entry's value must be a number or a gradient list")
                out = []
                for i, e in enumerate(value):
                    extra = set(e) - {"filter", "value"}
                    if extra:
                        self.fail(f"{key}[{i}].{sorted(extra)[0]}", "unknown key in a filter entry "
                                                                    "(expected filter and value)")
                    if "value" not in e:
                        self.fail(f"{key}[{i}]", "a filter entry needs value:")
                    flt = e.get("filter")
                    if flt is not None and not isinstance(flt, str):
                        self.fail(f"{key}[{i}].filter", f"expected a string (a substring of tensor names), got {flt!r}")
                    out.append({"filter": flt, "value": self.setting(name, f"{key}[{i}].value", e["value"], True)})
                return out
            if any(isinstance(e, (dict, list)) for e in value):
                self.fail(key, "a list must be all numbers (a gradient) or all {filter, value} entries")
            return [self.scalar(name, f"{key}[{i}]", e) for i, e in enumerate(value)]
        if value is None:
            self.fail(key, f"no value; expected {SETTING_FORMS}")
        return self.scalar(name, key, value)

    def parameters(self, key: str, params, per_model: bool, shared_rule: str = MODEL_SHARED_RULE) -> dict:
        if params is None:
            return {}
        if not isinstance(params, dict):
            self.fail(key, f"expected a mapping of parameter names to values, got {params!r}")
        out = {}
        for name, value in params.items():
            k = f"{key}.{name}"
            if name not in KNOWN_PARAMS:
                used = sorted({*self.info.per_model, *self.info.shared})
                self.fail(k, f"unknown parameter for {self.method} (it takes: {', '.join(used) or 'none'})")
            if per_model and name in self.info.shared:
                self.fail(k, f"{name} {shared_rule}")
            out[name] = self.setting(name, k, value)
        return out


def _dtype(source: str, key: str, value) -> tuple[torch.dtype | None, str | None]:
    if value is None:
        return None, None
    name = str(value)
    name = name[len("torch."):] if name.startswith("torch.") else name
    if name not in DTYPES:
        raise MergeConfigError(f"{source}: {key}: unknown dtype {value!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name], name


def _folder(source: str, config_dir: Path, key: str, value) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise MergeConfigError(f"{source}: {key}: expected a model folder path, got {value!r}")
    p = Path(value).expanduser()
    if not p.is_absolute() and not p.exists() and (config_dir / p).exists():
        p = config_dir / p  # relative to the current folder (as mergekit reads it), else to the config's
    if not p.exists():
        raise MergeConfigError(f"{source}: {key}: {value} does not exist (protege merge reads local model "
                               f"folders only; LoRA references and hub ids are not fetched)")
    if not p.is_dir():
        raise MergeConfigError(f"{source}: {key}: {value} is not a folder")
    return p.resolve()


def _layer_range(check: "_Checker", key: str, value) -> tuple[int, int]:
    whole = isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                for v in value)
    if not whole:
        check.fail(key, f"expected [start, end], two whole numbers (the layers start .. end-1), got {value!r}")
    start, end = value
    if not 0 <= start < end:
        check.fail(key, f"expected [start, end] with 0 <= start < end (the layers start .. end-1), got "
                        f"[{start}, {end}]")
    return start, end


def _parse_sources(check: "_Checker", key: str, raw, config_dir: Path, slice_base: Path | None,
                   distinct: dict[Path, ModelInput], base_path: Path | None) -> list[SliceSource]:
    if not raw:
        check.fail(f"{key}.sources", "missing or empty: list the slice's sources (each as `- model: PATH` with "
                                     "`layer_range: [START, END]`)")
    if not isinstance(raw, list):
        check.fail(f"{key}.sources", f"expected a list of `- model: PATH` entries, got {type(raw).__name__}")
    sources: list[SliceSource] = []
    seen: dict[Path, str] = {}
    for j, entry in enumerate(raw):
        skey = f"{key}.sources[{j}]"
        if not isinstance(entry, dict):
            check.fail(skey, f"expected a mapping with model: and layer_range:, got {entry!r}")
        for k in entry:
            if k not in ("model", "layer_range", "parameters"):
                check.fail(f"{skey}.{k}", "unknown key (a slice source has model:, layer_range: and parameters:)")
        if "model" not in entry:
            check.fail(f"{skey}.model", "missing: the model folder")
        path = _folder(check.source, config_dir, f"{skey}.model", entry["model"])
        if path in seen:  # mergekit keys a slice's inputs by model: one model cannot feed a slice twice
            check.fail(f"{skey}.model", f"{path} is already {seen[path]}")
        seen[path] = skey
        if "layer_range" not in entry:
            check.fail(f"{skey}.layer_range", "missing: expected [start, end], the layers start .. end-1 of the "
                                              "model")
        start, end = _layer_range(check, f"{skey}.layer_range", entry["layer_range"])
        params = check.parameters(f"{skey}.parameters", entry.get("parameters"), per_model=True,
                                  shared_rule="is shared by the slice's sources: put it under the slice's or the "
                                              "top-level parameters:")
        # the base is told apart only where the method has one: linear and passthrough merge it like any source
        is_base = check.info.needs_base and path == slice_base
        src = SliceSource(ModelInput(path, skey, params, is_base), start, end)
        if sources and src.length != sources[0].length:
            check.fail(f"{skey}.layer_range", f"[{start}, {end}] has {src.length} layers but {key}.sources[0] has "
                                              f"{sources[0].length}; every source of a slice gives one input per "
                                              f"output layer, so all need the same number of layers")
        sources.append(src)
        distinct.setdefault(path, ModelInput(path, skey, {}, path == base_path))
    return sources


def _check_slice_inputs(check: "_Checker", out: OutputSlice) -> None:
    info, method, n = check.info, check.method, len(out.sources)
    if info.needs_base:
        if out.base is None:
            check.fail(out.key, f"{method} needs a base_model ({_base_role(method)}): set base_model: at the top "
                                f"level or in the slice")
        if not any(s.model.is_base for s in out.sources):
            check.fail(f"{out.key}.sources", f"{method} takes the base_model's layers from the slice's sources, "
                                             f"but {out.base} is not among them (add it with its layer_range, as "
                                             f"mergekit requires)")
    if n < info.min_inputs or (info.max_inputs is not None and n > info.max_inputs):
        want = f"exactly {info.min_inputs}" if info.max_inputs == info.min_inputs else f"at least {info.min_inputs}"
        noun = "source" if info.min_inputs == 1 else "sources"
        counting = " counting the base_model" if info.needs_base else ""
        hint = {"passthrough": " (passthrough copies one source per slice: stack layers with one slice per range)",
                "slerp": " (slerp: the base_model and one other model)"}.get(method, "")
        check.fail(f"{out.key}.sources", f"{method} merges {want} {noun} per slice{counting}, got {n}{hint}")
    if info.needs_base and n < 2:
        check.fail(f"{out.key}.sources", f"{method} needs at least one source besides the base_model")


def _parse_slices(check: "_Checker", raw, config_dir: Path,
                  base_path: Path | None) -> tuple[list[OutputSlice], list[ModelInput]]:
    if not raw:
        check.fail("slices", "missing or empty: list the output slices (each as `- sources:` with `- model: PATH` "
                             "and `layer_range: [START, END]`)")
    if not isinstance(raw, list):
        check.fail("slices", f"expected a list of `- sources: ...` entries, got {type(raw).__name__}")
    slices: list[OutputSlice] = []
    distinct: dict[Path, ModelInput] = {}
    for i, entry in enumerate(raw):
        key = f"slices[{i}]"
        if not isinstance(entry, dict):
            check.fail(key, f"expected a mapping with sources: (and parameters:, base_model:), got {entry!r}")
        for k in entry:
            if k == "residual_weight":
                check.fail(f"{key}.{k}", "not supported (mergekit 0.1.5 reads it but never uses it); remove it")
            if k not in ("sources", "parameters", "base_model"):
                check.fail(f"{key}.{k}", "unknown key (a slice has sources:, parameters: and base_model:)")
        slice_base = base_path
        if entry.get("base_model") is not None:
            slice_base = _folder(check.source, config_dir, f"{key}.base_model", entry["base_model"])
        sources = _parse_sources(check, key, entry.get("sources"), config_dir, slice_base, distinct, base_path)
        params = check.parameters(f"{key}.parameters", entry.get("parameters"), per_model=False)
        out = OutputSlice(key, tuple(sources), params, slice_base if check.info.needs_base else None)
        _check_slice_inputs(check, out)
        slices.append(out)
    return slices, list(distinct.values())


def _base_role(method: str) -> str:
    return {"slerp": "the t=0 endpoint", "model_stock": "the pretrained anchor"}.get(
        method, "the model the task vectors are taken from")


def _parse_models(check: "_Checker", raw_models, config_dir: Path, base_path: Path | None) -> list[ModelInput]:
    if not raw_models:
        check.fail("models", "missing or empty: list the models to merge (each as `- model: PATH`), or layer "
                             "ranges under slices:")
    if not isinstance(raw_models, list):
        check.fail("models", f"expected a list of `- model: PATH` entries, got {type(raw_models).__name__}")
    models, seen = [], {}
    for i, entry in enumerate(raw_models):
        key = f"models[{i}]"
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict):
            check.fail(key, f"expected a mapping with model: and parameters:, got {entry!r}")
        for k in entry:
            if k not in ("model", "parameters"):
                check.fail(f"{key}.{k}", "unknown key (a model entry has model: and parameters:)")
        if "model" not in entry:
            check.fail(f"{key}.model", "missing: the model folder")
        path = _folder(check.source, config_dir, f"{key}.model", entry["model"])
        if path in seen:
            check.fail(f"{key}.model", f"{path} is already {seen[path]}")
        seen[path] = key
        is_base = base_path is not None and path == base_path
        params = check.parameters(f"{key}.parameters", entry.get("parameters"), per_model=True)
        models.append(ModelInput(path, key, params, is_base))
    return models


def _check_model_count(check: "_Checker", models: list[ModelInput], base: ModelInput | None) -> None:
    info, method = check.info, check.method
    n_inputs = len(models) + (1 if base is not None and not any(m.is_base for m in models) else 0)
    if n_inputs < info.min_inputs or (info.max_inputs is not None and n_inputs > info.max_inputs):
        want = (f"exactly {info.min_inputs}" if info.max_inputs == info.min_inputs
                else f"at least {info.min_inputs}")
        noun = "model" if info.min_inputs == 1 else "models"
        check.fail("models", f"{method} merges {want} {noun} counting the base_model, got {n_inputs}"
                             + (" (slerp: the base_model and one other model)" if method == "slerp" else ""))
    if info.needs_base and n_inputs - 1 < 1:
        check.fail("models", f"{method} needs at least one model besides the base_model")


def _check_required_models(check: "_Checker", cfg: MergeConfig) -> None:
    """Required parameters given nowhere at all (models: form): fail now, before any file is opened."""
    info, method, top = check.info, check.method, cfg.parameters
    for key, default in info.shared.items():
        if default is REQUIRED and key not in top:
            check.fail(f"parameters.{key}", f"missing: {method} needs {key} under the top-level parameters:")
    for m in cfg.merged:
        for key, default in info.per_model.items():
            if default is REQUIRED and key not in m.parameters and key not in top:
                if m.key == "base_model":
                    check.fail(f"parameters.{key}", f"missing: {method} merges the base_model too (mergekit adds "
                                                    f"it to the inputs), so give it a {key} under the top-level "
                                                    f"parameters: or list it under models: with its own")
                who = "input" if info.per_input_includes_base else "non-base model"
                check.fail(f"{m.key}.parameters.{key}", f"missing: {method} needs {key} for every {who} (set it "
                                                        f"here or under the top-level parameters:)")


def _check_required_slices(check: "_Checker", cfg: MergeConfig) -> None:
    """Required parameters given nowhere at all (slices: form): fail now, before any file is opened."""
    info, method, top = check.info, check.method, cfg.parameters
    for out in cfg.slices:
        for key, default in info.shared.items():
            if default is REQUIRED and key not in top and key not in out.parameters:
                check.fail(f"{out.key}.parameters.{key}", f"missing: {method} needs {key} under the slice's or the "
                                                          f"top-level parameters:")
        for src in out.sources:
            if src.model.is_base:
                continue
            for key, default in info.per_model.items():
                if default is REQUIRED and all(key not in p for p in (src.model.parameters, out.parameters, top)):
                    check.fail(f"{src.model.key}.parameters.{key}",
                               f"missing: {method} needs {key} for every "
                               f"{'source' if info.per_input_includes_base else 'non-base source'} (set it here, "
                               f"under the slice's parameters: or the top-level parameters:)")


def parse_config(data: Any, source: str = "<config>", config_dir: Path | None = None, text: str = "") -> MergeConfig:
    """Validates a loaded YAML document (see the module docstring). Paths must exist."""
    config_dir = config_dir or Path.cwd()

    def fail(key, message):
        raise MergeConfigError(f"{source}: {key}: {message}")

    if not isinstance(data, dict):
        raise MergeConfigError(f"{source}: expected a mapping with merge_method and models (or slices), got "
                               f"{type(data).__name__}")
    for key in data:
        if key not in SUPPORTED_KEYS:
            fail(key, UNSUPPORTED_HINT.get(key, f"not supported by protege merge (supported keys: "
                                                f"{', '.join(SUPPORTED_KEYS)})"))
    method = data.get("merge_method")
    if method is None:
        fail("merge_method", f"missing; expected one of {', '.join(sorted(METHODS))}")
    if method not in METHODS:
        fail("merge_method", f"unknown method {method!r}; expected one of {', '.join(sorted(METHODS))}")
    info = METHODS[method]
    check = _Checker(source, method, info)
    sliced = data.get("slices") is not None
    if sliced and data.get("models") is not None:
        fail("slices", "give models: or slices:, not both (mergekit takes exactly one of them)")

    base_path = _folder(source, config_dir, "base_model", data["base_model"]) \
        if data.get("base_model") is not None else None
    if info.needs_base and base_path is None and not sliced:
        fail("base_model", f"{method} needs a base_model ({_base_role(method)})")

    slices = None
    if sliced:
        slices, models = _parse_slices(check, data["slices"], config_dir, base_path)
    else:
        models = _parse_models(check, data.get("models"), config_dir, base_path)
    top = check.parameters("parameters", data.get("parameters"), per_model=False)

    base = None
    if base_path is not None:
        listed = [m for m in models if m.is_base]
        base = listed[0] if listed and not sliced else ModelInput(base_path, "base_model", {}, True)
    if not sliced:
        _check_model_count(check, models, base)

    dtype, dtype_name = _dtype(source, "dtype", data.get("dtype"))
    out_dtype, out_name = _dtype(source, "out_dtype", data.get("out_dtype"))

    donor = base.path if base is not None else models[0].path
    ts = data.get("tokenizer_source")
    if ts is None:
        tok = donor
    elif ts == "base":
        if base is None:
            fail("tokenizer_source", "base, but there is no base_model")
        tok = base.path
    elif ts == "union":
        fail("tokenizer_source", "union (merging vocabularies) is not supported; use base or a model folder")
    else:
        tok = _folder(source, config_dir, "tokenizer_source", ts)

    cfg = MergeConfig(source=source, method=method, info=info, models=models, base=base, parameters=top,
                      dtype=dtype, out_dtype=out_dtype, dtype_name=dtype_name, out_dtype_name=out_name,
                      donor=donor, tokenizer_folder=tok, text=text, slices=slices)
    if sliced:
        _check_required_slices(check, cfg)
    else:
        _check_required_models(check, cfg)
    return cfg


def load_config(path: str | Path) -> MergeConfig:
    """Reads and validates a merge YAML; errors are MergeConfigError naming the file and the key."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MergeConfigError(f"{source}: no such file") from None
    except OSError as exc:
        raise MergeConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise MergeConfigError(f"{source}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    return parse_config(data, source, path.parent.resolve(), text)
