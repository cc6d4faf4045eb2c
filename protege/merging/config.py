"""mergekit-style merge configs (the `models:` form), validated, and their parameters resolved per tensor.

Accepted YAML (mergekit's MergeConfiguration minus slices/modules/tokenizer surgery)::

    merge_method: ties                # see protege.merging.methods.METHODS
    base_model: ./ckpt/base           # needed by every method but linear
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

Resolution follows mergekit (mergekit/config.py `evaluate_setting`, mergekit/parameter_resolver.py,
mergekit/plan.py):
- a per-model parameter is looked up in the model's `parameters:`, then the top-level `parameters:`, then the
  method's default; a shared parameter (normalize, lambda, t, ...) only in the top-level `parameters:`;
- a list of `{filter, value}` entries: the FIRST entry whose filter is a substring of the tensor name (or has no
  filter, or filter "*") wins; when none matches the lookup falls through to the next level;
- a list of numbers is a gradient: with t in [0, 1] the tensor's position, x = t (n - 1), i = floor(x),
  value = (1 - (x - i)) v[i] + (x - i) v[min(i + 1, n - 1)] (booleans: v[int(t (n - 1))]);
- t of a tensor in layer i of a stack of L layers is i / (L - 1) (1 when L = 1); every tensor outside the
  layer stacks (embeddings, final norm, lm_head, ...) has t = 0, as mergekit plans pre- and post-weights.
  protege knows no architecture tables: a layer is a name component `layers|layer|h|blocks|block` followed by
  an index (`model.layers.3.`), and each distinct prefix (e.g. the text decoder's `model.layers.` and a vision
  tower's `visual.blocks.`) is its own stack whose L is its largest index + 1 in the reference model.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from protege.errors import UserFacingError
from protege.merging.methods import METHODS, REQUIRED, MethodInfo

SUPPORTED_KEYS = ("merge_method", "models", "base_model", "parameters", "dtype", "out_dtype", "tokenizer_source")
UNSUPPORTED_HINT = {
    "slices": "slices (layer ranges / frankenmerges) are not supported; list whole models under models:",
    "modules": "modules are not supported; list whole models under models:",
    "tokenizer": "tokenizer surgery (tokenizer:) is not supported; use tokenizer_source: base or a model folder",
    "chat_template": "chat_template is not supported; edit the output's tokenizer_config.json instead",
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
FLOAT_PARAMS = ("weight", "density", "gamma", "lambda", "t", "epsilon")
BOOL_PARAMS = ("normalize", "rescale", "int8_mask", "filter_wise")
# parameters some mergekit method takes: accepted (and ignored) by methods that do not use them, as mergekit does
KNOWN_PARAMS = set(FLOAT_PARAMS) | set(BOOL_PARAMS)
LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?=\.|$)")


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
    """One model folder of the merge. `key` names it in errors: models[i] or base_model."""
    path: Path
    key: str
    parameters: dict = field(default_factory=dict)
    is_base: bool = False

    @property
    def label(self) -> str:
        return f"{self.key} ({self.path})"


@dataclass
class MergeConfig:
    source: str                 # the config file, as named in errors
    method: str
    info: MethodInfo
    models: list[ModelInput]    # as listed under models:
    base: ModelInput | None     # the base_model (one of `models` when listed there)
    parameters: dict            # top-level parameters (validated, unresolved)
    dtype: torch.dtype | None
    out_dtype: torch.dtype | None
    dtype_name: str | None
    out_dtype_name: str | None
    donor: Path                 # folder whose non-weight files (config.json, ...) are copied
    tokenizer_folder: Path      # folder whose tokenizer / processor files are copied
    text: str = ""              # the YAML as read

    def error(self, key: str, message: str) -> MergeConfigError:
        return MergeConfigError(f"{self.source}: {key}: {message}")

    @property
    def inputs(self) -> list[ModelInput]:
        """mergekit's input order: the listed models, then the base_model when it is not listed."""
        if self.base is not None and not any(m.is_base for m in self.models):
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
        """(shared parameters, one dict of per-model parameters per `merged` input) for one tensor, numbers
        and booleans only. Raises MergeConfigError when a required parameter has no value for this tensor."""
        shared = {}
        for key, default in self.info.shared.items():
            value = _evaluate(self.parameters.get(key), tensor_name, t)
            if value is None:
                value = default
            if value is REQUIRED:
                raise self.error(f"parameters.{key}", f"{self.method} needs {key} (set it under the top-level "
                                                      f"parameters:); nothing matched tensor {tensor_name}")
            shared[key] = value
        per_model = []
        for m in self.merged:
            row = {}
            for key, default in self.info.per_model.items():
                value = _evaluate(m.parameters.get(key), tensor_name, t)
                if value is None:
                    value = _evaluate(self.parameters.get(key), tensor_name, t)
                if value is None:
                    value = default
                if value is REQUIRED:
                    raise self.error(f"{m.key}.parameters.{key}",
                                     f"{self.method} needs {key} for {m.path} (set it under the model's parameters: "
                                     f"or the top-level parameters:); nothing matched tensor {tensor_name}")
                row[key] = value
            per_model.append(row)
        if self.method == "linear" and shared.get("normalize") and sum(r["weight"] for r in per_model) == 0:
            raise self.error("parameters.normalize", f"the weights for tensor {tensor_name} sum to 0, so "
                                                     f"normalize: true cannot divide by them")
        return shared, per_model


# ------------------------------------------------------------------------------------------- evaluation

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
    counts: dict[str, int] = {}
    found = {}
    for name in names:
        m = LAYER_RE.search(name)
        if m:
            prefix, idx = name[:m.start(1)], int(m.group(1))
            found[name] = (prefix, idx)
            counts[prefix] = max(counts.get(prefix, 0), idx + 1)
    out = {}
    for name in names:
        if name in found:
            prefix, idx = found[name]
            n = counts[prefix]
            out[name] = idx / (n - 1) if n > 1 else 1.0
        else:
            out[name] = 0.0
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
            if not value:
                self.fail(key, "empty list")
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
            self.fail(key, "no value")
        return self.scalar(name, key, value)

    def parameters(self, key: str, params, per_model: bool) -> dict:
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
                self.fail(k, f"{name} is set once for the whole merge: put it under the top-level parameters:")
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


def parse_config(data: Any, source: str = "<config>", config_dir: Path | None = None, text: str = "") -> MergeConfig:
    """Validates a loaded YAML document (see the module docstring). Paths must exist."""
    config_dir = config_dir or Path.cwd()

    def fail(key, message):
        raise MergeConfigError(f"{source}: {key}: {message}")

    if not isinstance(data, dict):
        raise MergeConfigError(f"{source}: expected a mapping with merge_method and models, got {type(data).__name__}")
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

    base_path = _folder(source, config_dir, "base_model", data["base_model"]) \
        if data.get("base_model") is not None else None
    if info.needs_base and base_path is None:
        what = {"slerp": "the t=0 endpoint", "model_stock": "the pretrained anchor"}.get(method, "the model the "
                                                                                               "task vectors are "
                                                                                               "taken from")
        fail("base_model", f"{method} needs a base_model ({what})")

    raw_models = data.get("models")
    if not raw_models:
        fail("models", "missing or empty: list the models to merge (each as `- model: PATH`)")
    if not isinstance(raw_models, list):
        fail("models", f"expected a list of `- model: PATH` entries, got {type(raw_models).__name__}")
    models, seen = [], {}
    for i, entry in enumerate(raw_models):
        key = f"models[{i}]"
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict):
            fail(key, f"expected a mapping with model: and parameters:, got {entry!r}")
        for k in entry:
            if k not in ("model", "parameters"):
                fail(f"{key}.{k}", "unknown key (a model entry has model: and parameters:)")
        if "model" not in entry:
            fail(f"{key}.model", "missing: the model folder")
        path = _folder(source, config_dir, f"{key}.model", entry["model"])
        if path in seen:
            fail(f"{key}.model", f"{path} is already {seen[path]}")
        seen[path] = key
        is_base = base_path is not None and path == base_path
        params = check.parameters(f"{key}.parameters", entry.get("parameters"), per_model=True)
        models.append(ModelInput(path, key, params, is_base))
    top = check.parameters("parameters", data.get("parameters"), per_model=False)

    base = None
    if base_path is not None:
        listed = [m for m in models if m.is_base]
        base = listed[0] if listed else ModelInput(base_path, "base_model", {}, True)

    n_inputs = len(models) + (1 if base is not None and not any(m.is_base for m in models) else 0)
    if n_inputs < info.min_inputs or (info.max_inputs is not None and n_inputs > info.max_inputs):
        want = (f"exactly {info.min_inputs}" if info.max_inputs == info.min_inputs
                else f"at least {info.min_inputs}")
        fail("models", f"{method} merges {want} models counting the base_model, got {n_inputs}"
                       + (" (slerp: the base_model and one other model)" if method == "slerp" else ""))
    if info.needs_base and n_inputs - 1 < 1:
        fail("models", f"{method} needs at least one model besides the base_model")

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
                      donor=donor, tokenizer_folder=tok, text=text)
    # required parameters given nowhere at all: fail now, before any file is opened
    for key, default in info.shared.items():
        if default is REQUIRED and key not in top:
            fail(f"parameters.{key}", f"missing: {method} needs {key} under the top-level parameters:")
    for m in cfg.merged:
        for key, default in info.per_model.items():
            if default is REQUIRED and key not in m.parameters and key not in top:
                if m.key == "base_model":
                    fail(f"parameters.{key}", f"missing: {method} merges the base_model too (mergekit adds it "
                                              f"to the inputs), so give it a {key} under the top-level "
                                              f"parameters: or list it under models: with its own")
                fail(f"{m.key}.parameters.{key}", f"missing: {method} needs {key} for every "
                                                  f"{'input' if info.per_input_includes_base else 'non-base model'}"
                                                  f" (set it here or under the top-level parameters:)")
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
