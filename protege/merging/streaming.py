"""Merging whole checkpoints: folders on disk (streamed tensor by tensor) and state dicts in memory.

`merge_folders` checks everything before writing anything: the config, every folder's weights, every model's
tensor names and shapes against the reference (the base_model, else models[0]), and every tensor's resolved
parameters. Then, tensor by tensor, it reads that tensor from each input, merges it in float32 (or the config's
`dtype`), casts it to the output dtype and appends it to its output shard. Peak memory is therefore set by the
largest tensor S and the number of inputs K, whatever the models' sizes: about (K + 3) x S, and (K + 8) x S for
ties / breadcrumbs, whose magnitude ranking (torch.argsort on the whole tensor, exactly as mergekit ranks, ties
included) needs about 6 x S of workspace (benchmarks/merge_memory.py measures it). The inputs are
copy-on-write mappings of the files (safetensors), updated in place, so an input's pages become private memory
only as they are used and are released as soon as its task vector is taken. The output is built in a hidden
folder next to OUT_DIR and renamed to OUT_DIR at the end, so a failure leaves no OUT_DIR behind.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from protege.merging.config import MergeConfig, MergeConfigError, layer_positions, load_config
from protege.merging.io import (INDEX, SINGLE, TOKENIZER_FILES, Checkpoint, CheckpointError, ShardedWriter,
                                non_weight_files)
from protege.merging.methods import merge_tensor, method_info

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
CONFIG_COPY = "merge_config.yaml"  # the config as read, kept with the output for provenance

Progress = Callable[[int, int, str], None]


def _shape(s) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def _open_all(cfg: MergeConfig) -> dict[Path, Checkpoint]:
    out = {}
    for m in [*cfg.inputs]:
        try:
            out[m.path] = Checkpoint(m.path)
        except CheckpointError as exc:
            raise cfg.error(f"{m.key}", str(exc)) from None
    return out


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


def _out_dtype(cfg: MergeConfig, ref_dtype: torch.dtype) -> torch.dtype:
    if not ref_dtype.is_floating_point:
        return ref_dtype
    return cfg.out_dtype or cfg.dtype or ref_dtype


def _compute_dtype(cfg: MergeConfig, ref_dtype: torch.dtype) -> torch.dtype:
    if cfg.dtype is not None:
        return cfg.dtype
    return torch.float64 if ref_dtype == torch.float64 else torch.float32


def _copy_side_files(cfg: MergeConfig, folder: Path) -> None:
    for p in non_weight_files(cfg.donor):
        shutil.copy2(p, folder / p.name)
    if cfg.tokenizer_folder != cfg.donor:
        for p in non_weight_files(cfg.tokenizer_folder):
            if p.name in TOKENIZER_FILES or p.name.startswith("tokenizer"):
                shutil.copy2(p, folder / p.name)
    dtype_name = cfg.out_dtype_name or cfg.dtype_name
    conf = folder / "config.json"
    if dtype_name and conf.exists():  # as mergekit: the output config names out_dtype (else dtype)
        try:
            data = json.loads(conf.read_text())
        except ValueError:
            data = None
        if isinstance(data, dict):
            keys = [k for k in ("dtype", "torch_dtype") if k in data] or ["dtype"]
            for k in keys:
                data[k] = dtype_name
            conf.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    if cfg.text:
        (folder / CONFIG_COPY).write_text(cfg.text)


def merge_folders(config: MergeConfig | str | Path, out_dir: str | Path, progress: Progress | None = None,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, seed: int = 0, overwrite: bool = False) -> Path:
    """Merges the config's model folders into OUT_DIR (safetensors, loadable by `from_pretrained`).

    config: a MergeConfig or a YAML path. progress(done, total, tensor_name) is called after each tensor.
    Random methods draw from one torch.Generator seeded with `seed`, tensors in output order: the same
    inputs, config and seed give the same bytes. OUT_DIR must not exist unless `overwrite` (then it is
    replaced only once the new output is complete). Raises MergeConfigError (a UserFacingError).
    """
    cfg = config if isinstance(config, MergeConfig) else load_config(config)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise MergeConfigError(f"{out_dir}: already exists; remove it or pass --overwrite")
    if max_shard_bytes <= 0:
        raise MergeConfigError(f"max shard size must be positive, got {max_shard_bytes}")

    # ---- everything is checked before anything is written
    ckpts = _open_all(cfg)
    names = check_compatible(cfg, ckpts)
    ref_ck = ckpts[cfg.reference.path]
    positions = layer_positions(names)
    resolved = {name: cfg.resolve(name, positions[name]) for name in names}
    specs = [(n, _out_dtype(cfg, ref_ck.tensors[n].dtype), ref_ck.tensors[n].shape) for n in names]
    base_path = cfg.base.path if cfg.base is not None and cfg.info.needs_base else None
    merged_paths = [m.path for m in cfg.merged]
    labels = {m.path: m.label for m in cfg.inputs}

    def load(path: Path, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        try:
            t = ckpts[path].get(name)
        except Exception as exc:  # noqa: BLE001 - safetensors' own errors: a file changed or broken under us
            raise cfg.error(labels[path], f"cannot read tensor {name}: {exc}") from None
        return t.to(dtype) if dtype is not None else t

    # ---- stream into a hidden folder next to OUT_DIR, then rename
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as exc:
        raise MergeConfigError(f"{out_dir}: cannot create the output next to it: {exc.strerror or exc}") from None
    writer = None
    try:
        writer = ShardedWriter(tmp, specs, max_shard_bytes, metadata={"merge_method": cfg.method})
        generator = torch.Generator().manual_seed(seed)
        total = len(writer.order)
        for done, name in enumerate(writer.order, start=1):
            ref_dtype = ref_ck.tensors[name].dtype
            shared, per_model = resolved[name]
            if ref_dtype.is_floating_point:
                cdt = _compute_dtype(cfg, ref_dtype)
                base = load(base_path, name, cdt) if base_path is not None else None
                tensors = [load(p, name, cdt) for p in merged_paths]
                try:
                    out = merge_tensor(cfg.method, tensors, base, per_model, shared, generator, consume=True)
                except ValueError as exc:
                    raise cfg.error("merge_method", f"tensor {name}: {exc}") from None
                del tensors, base
            else:  # integer / bool buffers: the reference's value
                out = load(cfg.reference.path, name)
            writer.write(name, out.to(_out_dtype(cfg, ref_dtype)))
            del out
            if progress is not None:
                progress(done, total, name)
        writer.finish()
        _copy_side_files(cfg, tmp)
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, old / "x")
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException as exc:
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise MergeConfigError(f"{out_dir}: writing the merge failed (nothing was left behind): "
                                   f"{exc.strerror or exc}") from None
        raise
    return out_dir


def merge_state_dicts(method: str, states: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor] | None = None,
                      parameters: dict | None = None, generator: torch.Generator | None = None,
                      dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """In-memory merge for the RL loop: `states` are the merged models (every input for linear; the non-base
    ones otherwise), `base` the base model's state dict where the method needs one.

    parameters: name -> a number for every model, or a list with one number per entry of `states` for the
    per-model parameters (weight, density, gamma); shared ones (normalize, lambda, t, ...) are single values.
    Missing ones take mergekit's defaults (weight defaults to 1 here). Arithmetic in `dtype`; each output
    tensor has the base's (else the first state's) dtype; non-float tensors are copied from the base/first.
    """
    info = method_info(method)
    if not states:
        raise ValueError("nothing to merge: no state dicts given")
    if info.needs_base and base is None:
        raise ValueError(f"{method} needs a base state dict")
    if not info.needs_base and base is not None:
        raise ValueError(f"{method} takes no base: pass every model in `states`")
    ref = base if base is not None else states[0]
    for i, s in enumerate(states):
        if set(s) != set(ref):
            diff = sorted(set(s) ^ set(ref))
            raise ValueError(f"state {i} has different tensors than the {'base' if base is not None else 'first'}: "
                             f"{diff[:5]}")
        for k, v in s.items():
            if v.shape != ref[k].shape:
                raise ValueError(f"state {i}: tensor {k} has shape {list(v.shape)}, expected {list(ref[k].shape)}")
    parameters = dict(parameters or {})
    shared = {k: v for k, v in parameters.items() if k in info.shared}
    unknown = set(parameters) - set(info.shared) - set(info.per_model)
    if unknown:
        raise ValueError(f"unknown parameter(s) for {method}: {', '.join(sorted(unknown))}")
    per_model = []
    for i in range(len(states)):
        row = {}
        for k in info.per_model:
            if k in parameters:
                v = parameters[k]
                if isinstance(v, (list, tuple)):
                    if len(v) != len(states):
                        raise ValueError(f"parameter {k}: {len(v)} values for {len(states)} states")
                    v = v[i]
                row[k] = float(v)
            elif k == "weight":
                row[k] = 1.0
        per_model.append(row)
    out = {}
    with torch.no_grad():
        for name, r in ref.items():
            if not r.is_floating_point():
                out[name] = r.clone()
                continue
            b = base[name].to(dtype) if base is not None else None
            merged = merge_tensor(method, [s[name].to(dtype) for s in states], b, per_model, shared, generator)
            out[name] = merged.to(r.dtype)
    return out
