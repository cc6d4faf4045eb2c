"""Merging whole checkpoints: folders on disk (streamed tensor by tensor) and state dicts in memory.

`merge_folders` checks everything before writing anything: the config, every folder's weights, every model's
tensor names and shapes against the reference (the base_model, else models[0]) or, for slices, every layer range
against its model's layers, and every tensor's resolved parameters (protege.merging.plan). Then, tensor by
tensor, it reads that tensor from each input, merges it in float32 (or the config's `dtype`), casts it to the
output dtype and writes it into its output shard. Peak memory is therefore set by the
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

from protege.merging.config import MergeConfig, MergeConfigError, load_config
from protege.merging.io import TOKENIZER_FILES, Checkpoint, CheckpointError, ShardedWriter, non_weight_files
from protege.merging.methods import merge_tensor, method_info
from protege.merging.plan import MergePlan, check_compatible, plan_merge, rewrite_layer_count  # noqa: F401

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
CONFIG_COPY = "merge_config.yaml"  # the config as read, kept with the output for provenance

Progress = Callable[[int, int, str], None]


def _open_all(cfg: MergeConfig) -> dict[Path, Checkpoint]:
    out = {}
    for m in [*cfg.inputs]:
        try:
            out[m.path] = Checkpoint(m.path)
        except CheckpointError as exc:
            raise cfg.error(f"{m.key}", str(exc)) from None
    return out


def _out_dtype(cfg: MergeConfig, ref_dtype: torch.dtype) -> torch.dtype:
    if not ref_dtype.is_floating_point:
        return ref_dtype
    return cfg.out_dtype or cfg.dtype or ref_dtype


def _compute_dtype(cfg: MergeConfig, ref_dtype: torch.dtype) -> torch.dtype:
    if cfg.dtype is not None:
        return cfg.dtype
    return torch.float64 if ref_dtype == torch.float64 else torch.float32


def _copy_side_files(cfg: MergeConfig, folder: Path, plan: MergePlan) -> None:
    for p in non_weight_files(cfg.donor):
        shutil.copy2(p, folder / p.name)
    if cfg.tokenizer_folder != cfg.donor:
        for p in non_weight_files(cfg.tokenizer_folder):
            if p.name in TOKENIZER_FILES or p.name.startswith("tokenizer"):
                shutil.copy2(p, folder / p.name)
    _rewrite_config(cfg, folder / "config.json", plan)
    if cfg.text:
        (folder / CONFIG_COPY).write_text(cfg.text)


def _rewrite_config(cfg: MergeConfig, conf: Path, plan: MergePlan) -> None:
    """As mergekit: the output config names out_dtype (else dtype), and a slices merge's layer count."""
    dtype_name = cfg.out_dtype_name or cfg.dtype_name
    if not conf.exists() or (not dtype_name and plan.layer_sources is None):
        return
    try:
        data = json.loads(conf.read_text())
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    if dtype_name:
        for k in [k for k in ("dtype", "torch_dtype") if k in data] or ["dtype"]:
            data[k] = dtype_name
    if plan.layer_sources is not None:
        rewrite_layer_count(data, plan.layer_sources)
    conf.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def merge_folders(config: MergeConfig | str | Path, out_dir: str | Path, progress: Progress | None = None,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, seed: int = 0, overwrite: bool = False) -> Path:
    """Merges the config's model folders into OUT_DIR (safetensors, loadable by `from_pretrained`).

    config: a MergeConfig or a YAML path (models: or slices: form). progress(done, total, tensor_name) is called
    after each tensor. Random methods draw from one torch.Generator seeded with `seed`, tensors in mergekit's
    order (protege.merging.plan): the same inputs, config and seed give the same bytes, and mergekit's masks
    for `mergekit-yaml --random-seed SEED`. OUT_DIR must not exist unless `overwrite` (then it is
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
    plan = plan_merge(cfg, ckpts)
    schedule = plan.schedule  # mergekit's order, so a random method draws mergekit's masks for a seed
    info = {job.name: ckpts[job.reference[0]].tensors[job.reference[1]] for job in schedule}
    specs = [(job.name, _out_dtype(cfg, info[job.name].dtype), info[job.name].shape) for job in schedule]

    def load(ref: tuple[Path, str], dtype: torch.dtype | None = None) -> torch.Tensor:
        path, name = ref
        try:
            t = ckpts[path].get(name)
        except Exception as exc:  # noqa: BLE001 - safetensors' own errors: a file changed or broken under us
            raise cfg.error(plan.labels.get(path, str(path)), f"cannot read tensor {name}: {exc}") from None
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
        total = len(schedule)
        for done, job in enumerate(schedule, start=1):
            ref_dtype = info[job.name].dtype
            if ref_dtype.is_floating_point:
                cdt = _compute_dtype(cfg, ref_dtype)
                base = load(job.base, cdt) if job.base is not None else None
                tensors = [load(ref, cdt) for ref in job.inputs]
                try:
                    out = merge_tensor(cfg.method, tensors, base, list(job.per_model), job.shared, generator,
                                       consume=True)
                except ValueError as exc:
                    raise cfg.error("merge_method", f"tensor {job.name}: {exc}") from None
                del tensors, base
            else:  # integer / bool buffers: the reference's value
                out = load(job.reference)
            writer.write(job.name, out.to(_out_dtype(cfg, ref_dtype)))
            del out
            if progress is not None:
                progress(done, total, job.name)
        writer.finish()
        _copy_side_files(cfg, tmp, plan)
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
        for name in sorted(ref):  # mergekit's order for the random draws, as merge_folders
            r = ref[name]
            if not r.is_floating_point():
                out[name] = r.clone()
                continue
            b = base[name].to(dtype) if base is not None else None
            merged = merge_tensor(method, [s[name].to(dtype) for s in states], b, per_model, shared, generator)
            out[name] = merged.to(r.dtype)
    return {name: out[name] for name in ref}
