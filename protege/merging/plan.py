"""What each output tensor of a merge is made of, decided (and checked) before any tensor is read.

A `TensorJob` names one output tensor, the (folder, tensor name) of each input `merge_tensor` takes, the base's,
and the parameters resolved for it. `plan_merge` builds them for both config forms, as mergekit/plan.py does:

- models: every tensor name of the reference model, from the same name in every input;
- slices: (mergekit's MergePlanner.plan_module) the *pre* weights (embeddings, and everything else that is not
  a decoder layer or after it: a VLM's vision tower and projector) from slices[0]'s sources with slices[0]'s
  parameters; then output layer 0, 1, ... counting up across the slices, output layer k of a slice taking layer
  start + k of each of its sources at t = k / (n - 1); then the *post* weights (final norm, lm_head) from the
  last slice, with its parameters. protege.models.layer_names says which tensors are which.

Jobs are merged in mergekit's schedule order: sorted by the largest input tensor name (mergekit's
`lexicographical_topological_sort` keyed by each task's group label, which is that name), ties in output order.
A random method draws its masks from one generator in that order, non-base inputs in config order, so the
same seed gives mergekit's masks (mergekit draws from torch's global generator, seeded by --random-seed).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from protege.merging.config import MergeConfig, ModelInput, OutputSlice, SliceSource, layer_positions
from protege.merging.io import Checkpoint
from protege.models.layer_names import (LayoutError, decoder_stack, is_post_weight, split_layer_name,
                                    text_config_scopes)

Ref = tuple[Path, str]  # (model folder, tensor name in it)


@dataclass(frozen=True)
class TensorJob:
    name: str                       # the output tensor
    inputs: tuple[Ref, ...]         # what merge_tensor takes as `tensors` (non-base inputs, or all for linear)
    base: Ref | None                # the base's tensor, for methods with a base
    reference: Ref                  # shape / dtype / the value of integer buffers: the base, else inputs[0]
    shared: dict
    per_model: tuple[dict, ...]
    order_key: str                  # mergekit's schedule label: the largest input tensor name


@dataclass
class MergePlan:
    jobs: list[TensorJob]           # in output (file) order
    # slices: output layer j is layer layer_sources[j] of slices' first sources (config.json's layer_types)
    layer_sources: list[int] | None = None
    labels: dict[Path, str] = field(default_factory=dict)

    @property
    def schedule(self) -> list[TensorJob]:
        """The jobs in mergekit's execution order (see the module docstring); sorted() is stable."""
        return sorted(self.jobs, key=lambda j: j.order_key)


def _shape(s) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


# ------------------------------------------------------------------------------------------- models: form

def check_compatible(cfg: MergeConfig, ckpts: dict[Path, Checkpoint]) -> list[str]:
    """Every input has exactly the reference's tensor names and shapes; returns the names in reference order."""
    ref = cfg.reference
    ref_ck = ckpts[ref.path]
    ref_word = "base" if cfg.base is not None else ref.key
    names = ref_ck.names()
    for m in cfg.inputs:
        if m.path == ref.path:
            continue
        ck = ckpts[m.path]
        for name in names:
            if name not in ck.tensors:
                raise cfg.error(m.label, f"tensor {name} is missing ({ref_word} has it)")
            a, b = ck.tensors[name].shape, ref_ck.tensors[name].shape
            if a != b:
                raise cfg.error(m.label, f"tensor {name} has shape {_shape(a)}, {ref_word} has {_shape(b)}")
        extra = [n for n in ck.names() if n not in ref_ck.tensors]
        if extra:
            raise cfg.error(m.label, f"tensor {extra[0]} is not in {ref_word}"
                                     + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    return names


def _plan_models(cfg: MergeConfig, ckpts: dict[Path, Checkpoint]) -> MergePlan:
    names = check_compatible(cfg, ckpts)
    positions = layer_positions(names)
    base_path = cfg.base.path if cfg.base is not None and cfg.info.needs_base else None
    jobs = []
    for name in names:
        shared, per_model = cfg.resolve(name, positions[name])
        jobs.append(TensorJob(name, tuple((m.path, name) for m in cfg.merged),
                              (base_path, name) if base_path is not None else None,
                              (cfg.reference.path, name), shared, tuple(per_model), name))
    return MergePlan(jobs, labels={m.path: m.label for m in cfg.inputs})


# ------------------------------------------------------------------------------------------- slices: form

def _read_config(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class _Layout:
    """One model's decoder: its prefix, its layer count and each layer's tensor suffixes (in name order)."""
    prefix: str
    count: int
    layers: dict[int, list[str]]
    others: list[str]               # every tensor that is not a decoder layer


def _layouts(cfg: MergeConfig, ckpts: dict[Path, Checkpoint]) -> dict[Path, _Layout]:
    out: dict[Path, _Layout] = {}
    first: ModelInput | None = None
    for m in cfg.models:
        names = ckpts[m.path].names()
        try:
            prefix, count = decoder_stack(names, _read_config(m.path))
        except LayoutError as exc:
            raise cfg.error(m.label, str(exc)) from None
        if first is not None and prefix != out[first.path].prefix:
            raise cfg.error(m.label, f"its decoder layers are {prefix}<i>, {first.key}'s are "
                                     f"{out[first.path].prefix}<i>; slices need one naming")
        layers: dict[int, list[str]] = {}
        others = []
        for name in names:
            ln = split_layer_name(name)
            if ln is not None and ln.prefix == prefix:
                layers.setdefault(ln.index, []).append(ln.suffix)
            else:
                others.append(name)
        out[m.path] = _Layout(prefix, count, layers, others)
        first = first or m
    return out


def _check_ranges(cfg: MergeConfig, layouts: dict[Path, _Layout]) -> None:
    for out in cfg.slices:
        for src in out.sources:
            lay = layouts[src.model.path]
            if src.end > lay.count:
                raise cfg.error(f"{src.model.key}.layer_range",
                                f"[{src.start}, {src.end}] goes beyond the {lay.count} layers of {src.model.path} "
                                f"({lay.prefix}0 .. {lay.prefix}{lay.count - 1}); expected 0 <= start < end <= "
                                f"{lay.count}")
            missing = [i for i in range(src.start, src.end) if i not in lay.layers]
            if missing:
                raise cfg.error(f"{src.model.key}.layer_range", f"{src.model.path} has no tensors for layer "
                                                                f"{lay.prefix}{missing[0]}")


def _job(cfg: MergeConfig, ckpts: dict[Path, Checkpoint], out: OutputSlice, sources: tuple[SliceSource, ...],
         out_name: str, in_names: list[str], t: float) -> TensorJob:
    """One output tensor from tensor in_names[k] of sources[k]; every input checked against the first one."""
    first = sources[0]
    ref_info = ckpts[first.model.path].tensors.get(in_names[0])
    if ref_info is None:  # a post weight the last slice's model lacks
        raise cfg.error(first.model.label, f"tensor {in_names[0]} is missing "
                                           f"({cfg.slices[0].sources[0].model.key} has it)")
    for src, name in zip(sources[1:], in_names[1:]):
        info = ckpts[src.model.path].tensors.get(name)
        if info is None:
            raise cfg.error(src.model.label, f"tensor {name} is missing ({first.model.key} has {in_names[0]})")
        if info.shape != ref_info.shape:
            raise cfg.error(src.model.label, f"tensor {name} has shape {_shape(info.shape)}, {first.model.key}'s "
                                             f"{in_names[0]} has {_shape(ref_info.shape)}")
    # mergekit's non-base entries, in source order, are merge_tensor's `tensors`
    at_base = next((i for i, s in enumerate(sources) if s.model.is_base), None)
    merged = [i for i in range(len(sources)) if i != at_base]
    shared, per_model = cfg.resolve_slice(out, [sources[i] for i in merged], out_name,
                                          [in_names[i] for i in merged], t)
    base_ref = (sources[at_base].model.path, in_names[at_base]) if at_base is not None else None
    inputs = tuple((sources[i].model.path, in_names[i]) for i in merged)
    return TensorJob(out_name, inputs, base_ref, base_ref or inputs[0], shared, tuple(per_model), max(in_names))


def _layer_jobs(cfg: MergeConfig, ckpts: dict[Path, Checkpoint], layouts: dict[Path, _Layout], out: OutputSlice,
                k: int, out_index: int) -> list[TensorJob]:
    """The tensors of output layer `out_index`: layer start + k of each source of `out`."""
    t = k / (out.length - 1) if out.length > 1 else 1.0  # mergekit's plan_slice
    first = out.sources[0]
    prefix = layouts[first.model.path].prefix
    suffixes = layouts[first.model.path].layers[first.start + k]
    for src in out.sources[1:]:
        extra = sorted(set(layouts[src.model.path].layers[src.start + k]) - set(suffixes))
        if extra:
            raise cfg.error(src.model.label, f"tensor {prefix}{src.start + k}.{extra[0]} has no counterpart in "
                                             f"{first.model.key}'s layer {first.start + k}")
    jobs = []
    for suffix in suffixes:
        in_names = [f"{prefix}{s.start + k}.{suffix}" for s in out.sources]
        jobs.append(_job(cfg, ckpts, out, out.sources, f"{prefix}{out_index}.{suffix}", in_names, t))
    return jobs


def _edge_jobs(cfg: MergeConfig, ckpts: dict[Path, Checkpoint], names: list[str], out: OutputSlice,
               sources: tuple[SliceSource, ...]) -> list[TensorJob]:
    """Pre or post weights: the same name in each source, t = 0, the slice's parameters."""
    if cfg.info.needs_base and not any(s.model.is_base for s in sources):
        raise cfg.error(f"{out.key}.sources", f"the weights after the layers ({names[0]}, ...) take the first "
                                              f"{len(sources)} sources of the last slice (as many as slices[0] "
                                              f"has, as mergekit does), which leaves out the base_model")
    return [_job(cfg, ckpts, out, sources, name, [name] * len(sources), 0.0) for name in names]


def _plan_slices(cfg: MergeConfig, ckpts: dict[Path, Checkpoint]) -> MergePlan:
    layouts = _layouts(cfg, ckpts)
    _check_ranges(cfg, layouts)
    first, last = cfg.slices[0], cfg.slices[-1]
    lead = layouts[first.sources[0].model.path]
    pre = [n for n in lead.others if not is_post_weight(n, lead.prefix)]
    post = [n for n in lead.others if is_post_weight(n, lead.prefix)]
    jobs = _edge_jobs(cfg, ckpts, pre, first, first.sources) if pre else []
    layer_sources, out_index = [], 0
    for out in cfg.slices:
        for k in range(out.length):
            jobs += _layer_jobs(cfg, ckpts, layouts, out, k, out_index)
            layer_sources.append(out.sources[0].start + k)
            out_index += 1
    if post:
        # mergekit pairs the last slice's models with one weight entry per source of slices[0] (zip), so only
        # that many of the last slice's sources feed the post weights
        jobs += _edge_jobs(cfg, ckpts, post, last, last.sources[:len(first.sources)])
    return MergePlan(jobs, layer_sources, {m.path: m.label for m in cfg.models})


def plan_merge(cfg: MergeConfig, ckpts: dict[Path, Checkpoint]) -> MergePlan:
    """Every output tensor's job (see the module docstring); raises MergeConfigError naming the key / model."""
    return _plan_slices(cfg, ckpts) if cfg.slices is not None else _plan_models(cfg, ckpts)


# ------------------------------------------------------------------------------------------- config.json

def rewrite_layer_count(config: dict, layer_sources: list[int]) -> bool:
    """Sets num_hidden_layers to the output's layer count where config.json states the text decoder's (the top
    level, text_config, ...), as mergekit does, and rebuilds a per-layer `layer_types` list beside it from the
    source layers (transformers checks its length). Returns whether anything changed."""
    changed = False
    for scope in text_config_scopes(config):
        old = scope.get("num_hidden_layers")
        if not isinstance(old, int) or isinstance(old, bool):
            continue
        scope["num_hidden_layers"] = len(layer_sources)
        types = scope.get("layer_types")
        if isinstance(types, list) and len(types) == old and types:
            scope["layer_types"] = [types[min(i, len(types) - 1)] for i in layer_sources]
        changed = True
    return changed
