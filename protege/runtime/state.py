"""Training state for exact resume, without pickle: tensors in safetensors, the rest in JSON.

A state folder holds named parts (`Part`: model weights, an optimizer with its LR schedule, the torch RNG;
a new part joins by name, without a new signature), plus state.json: the step, the data cursor, the python
RNG, the run's fingerprint and the number of processes. It is written to a temporary folder and renamed
into place, so a kill leaves the previous state intact.

Under DeepSpeed every rank takes part: rank 0 writes the whole parts (full weights) and state.json, each
rank writes its per-rank parts (its ZeRO partition of the optimizer state, its torch RNG state). DeepSpeed's
own save_checkpoint is not used because its loader unpickles what it reads; this format never does.
Files: `<name>.safetensors` (+ `<name>.json`) for a whole part, `<name>-rank<r>.*` for a per-rank one.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import load_file, save_file

from protege import provenance
from protege.runtime.distributed import world

CPU = torch.device("cpu")


class Part(Protocol):
    per_rank: bool  # True: every rank holds its own piece; False: one whole copy, written by rank 0

    def dump(self) -> tuple[dict[str, torch.Tensor], dict | None]:
        """(tensors, JSON-able extras or None); every rank calls it (collective under ZeRO-3)."""

    def load(self, tensors: dict[str, torch.Tensor], extras: dict | None) -> None: ...


class Weights:
    """A model's weights: through its updater (whole even under ZeRO-3), or a module trained by no one. Frozen
    parameters are left out: they are the checkpoint the run starts from, which the run's fingerprint pins,
    and a resume loads it again. A LoRA run's state then holds its adapters, not the base (at 7B ~1 GB, not
    ~15 GB per save); buffers are kept."""
    per_rank = False

    def __init__(self, source):
        self.source = source

    def _frozen(self) -> set[str]:
        model = self.source if isinstance(self.source, torch.nn.Module) else self.source.model
        return {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def dump(self):
        frozen = self._frozen()  # left out before the host copy, not after
        if isinstance(self.source, torch.nn.Module):
            return {k: v.detach().cpu().contiguous() for k, v in self.source.state_dict().items()
                    if k not in frozen}, None
        return self.source.full_state_dict(skip=frozen), None

    def load(self, tensors, extras):
        keep = self._frozen()
        if isinstance(self.source, torch.nn.Module):
            check_loaded(self.source.load_state_dict(tensors, strict=False), keep)
        else:
            self.source.load_weights(tensors, keep=keep)


def collective_dump(part) -> bool:
    """Whether every rank must call `part.dump()`: weights held by a ZeRO-3 engine are gathered to be read."""
    source = getattr(part, "source", None)
    return getattr(source, "zero_stage", 0) == 3


def check_loaded(result, frozen: set[str]) -> None:
    """A state loaded with strict=False: only frozen parameters may be absent from it, and nothing may be extra
    (another model's state)."""
    missing = [k for k in result.missing_keys if k not in frozen]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"the training state does not fit this model: missing {missing[:5]}, "
                           f"unexpected {list(result.unexpected_keys)[:5]}")


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied embeddings and LM head, as in Gemma): each later
    alias is stored as its own copy; loading gives the tied parameter the same values twice."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for key, t in tensors.items():
        span = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) if t.numel() else (0, id(t))
        out[key] = t.clone() if span in seen else t
        seen.add(span)
    return out


def optimizer_to_files(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_files(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for key, v in list(tensors.items()) + list(meta["scalars"].items()):
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    # load_state_dict moves each moment onto its parameter's device
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


class OptimizerState:
    """An updater's optimizer moments and hyper-parameters, its LR schedule's position, and the fp32 master
    weights it steps in place of bf16 ones (`master.<i>`): the bf16 weights are those rounded, so a resume that
    re-derived them would not reach the weights of an uninterrupted run."""

    def __init__(self, updater):
        self.updater = updater
        self.per_rank = updater.partitioned

    def dump(self):
        with self.updater.optimizer_view() as optimizer:
            tensors, meta = optimizer_to_files(optimizer)
        masters = self.updater.master_weights()
        tensors.update({f"master.{i}": m.detach().cpu().contiguous() for i, m in enumerate(masters)})
        meta["masters"] = len(masters)
        if self.updater.scheduler is not None:  # the lambdas are code, not state: LambdaLR stores None for them
            meta["scheduler"] = {k: v for k, v in self.updater.scheduler.state_dict().items() if k != "lr_lambdas"}
        return tensors, meta

    def load(self, tensors, extras):
        saved = {k: tensors.pop(k) for k in [k for k in tensors if k.startswith("master.")]}
        masters = self.updater.master_weights()
        # a state from before master weights were saved has none: the masters stay as the weights gave them
        if saved and len(saved) != len(masters):
            raise ValueError(f"the saved optimizer state has {len(saved)} master weights, but this run steps "
                             f"{len(masters)}: was it saved with another model.dtype?")
        with torch.no_grad():
            for i, m in enumerate(masters if saved else []):
                m.copy_(saved[f"master.{i}"])
        with self.updater.optimizer_view() as optimizer:
            optimizer_from_files(optimizer, tensors, extras)
        if self.updater.scheduler is not None:
            if "scheduler" not in extras:
                raise ValueError("the saved optimizer state has no LR schedule, but this run uses one")
            sched = self.updater.scheduler
            sched.load_state_dict({**extras["scheduler"], "lr_lambdas": [None] * len(sched.lr_lambdas)})


class TorchRNG:
    """The torch generator(s) this process draws from; ranks draw differently, so one file per rank."""
    per_rank = True

    def __init__(self, device: torch.device = CPU):
        self.device = device

    def dump(self):
        out = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":  # sampling on the GPU draws from the CUDA generator
            out["cuda"] = torch.cuda.get_rng_state(self.device)
        return out, None

    def load(self, tensors, extras):
        torch.set_rng_state(tensors["torch"])
        if "cuda" in tensors and self.device.type == "cuda":
            torch.cuda.set_rng_state(tensors["cuda"], self.device)


def _file_stem(name: str, part: Part, rank: int) -> str:
    return f"{name}-rank{rank}" if part.per_rank else name


def fingerprint(params: dict, seed: int, inputs_digest: str = "") -> str:
    """Identifies the run a state belongs to: the settings that change its result, the seed, the number of
    processes (each holds its own optimizer partition and RNG) and the caller's digest of its inputs."""
    blob = json.dumps([params, seed, world()[1]] + ([inputs_digest] if inputs_digest else []), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def save_state(folder: Path, *, step: int, parts: dict[str, Part], py_rng: random.Random, cursor: dict,
               fingerprint: str, rank: int = 0, world_size: int = 1, barrier=lambda: None) -> None:
    """Collective under DeepSpeed: every rank calls it with the same parts; a whole part is dumped by rank 0 only,
    unless its dump is collective (`collective_dump`)."""
    tmp = folder.with_name(folder.name + ".tmp")
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    for name, part in parts.items():
        # a whole part is copied to the host by rank 0 alone (at 7B a full copy per rank is ~15 GB of host memory
        # for nothing), unless dumping it is a collective every rank must join (ZeRO-3 gathers the weights)
        if not (part.per_rank or rank == 0 or collective_dump(part)):
            continue
        tensors, extras = part.dump()
        if part.per_rank or rank == 0:
            stem = _file_stem(name, part, rank)
            save_file(_unshared(tensors), str(tmp / f"{stem}.safetensors"))
            if extras is not None:
                (tmp / f"{stem}.json").write_text(json.dumps(extras))
    barrier()  # every rank's files are in tmp
    if rank == 0:
        provenance.write(tmp)  # the stage's record of what made this state
        # state.json last, once every file is there: a folder holding it is a complete state
        version, internal, gauss = py_rng.getstate()  # the same on every rank: all draw the whole step
        (tmp / "state.json.part").write_text(json.dumps({"step": step, "cursor": cursor, "fingerprint": fingerprint,
                                                         "world_size": world_size,
                                                         "python_rng": [version, list(internal), gauss]}))
        os.replace(tmp / "state.json.part", tmp / "state.json")
        if folder.exists():  # swap: the old state is removed only after the new one is complete
            old = folder.with_name(folder.name + ".old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(folder, old)
            os.replace(tmp, folder)  # killed just before this: recover_state finishes the swap
            shutil.rmtree(old)
        else:
            os.replace(tmp, folder)
    barrier()


def _newest_complete(folder: Path) -> Path | None:
    """Where the newest complete state is: `folder`, or, when a kill interrupted a swap (see
    `save_state`: `<state>` -> `<state>.old`, then `<state>.tmp` -> `<state>`), `.tmp` before `.old`."""
    for candidate in (folder, folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")):
        if (candidate / "state.json").exists():
            return candidate
    return None


def recover_state(folder: Path) -> None:
    """Finishes a swap a kill interrupted, so the newest complete state is at `folder` and nothing else
    is left. Only the process that owns the state calls this (it moves folders)."""
    found = _newest_complete(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    if found is not None and found != folder:
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(found, folder)
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)


def read_state(folder: Path) -> dict | None:
    """The newest complete state's metadata, wherever a kill left it; reads only (safe while a run
    writes)."""
    found = _newest_complete(folder)
    if found is None:
        return None
    try:
        return json.loads((found / "state.json").read_text())
    except (OSError, json.JSONDecodeError):  # renamed away between the check and the read
        return None


def restore_state(folder: Path, meta: dict, *, parts: dict[str, Part], py_rng: random.Random,
                  rank: int = 0) -> None:
    """Loads the parts in their order (weights before their optimizer: DeepSpeed refreshes its fp32 copy
    from the weights) and the python RNG. Every rank calls it; a missing part is an error, not a fresh start."""
    for name, part in parts.items():
        stem = _file_stem(name, part, rank)
        tensors_file, extras_file = folder / f"{stem}.safetensors", folder / f"{stem}.json"
        if not tensors_file.exists():
            raise FileNotFoundError(f"{folder}: the training state has no {stem}.safetensors; delete the folder "
                                    "to start this run afresh")
        part.load(load_file(str(tensors_file)),
                  json.loads(extras_file.read_text()) if extras_file.exists() else None)
    version, internal, gauss = meta["python_rng"]
    py_rng.setstate((version, tuple(internal), gauss))


def prepare_state(folder: Path, fp: str, rank: int, barrier) -> dict | None:
    """The metadata of a state at `folder` this run (fingerprint `fp`) continues, or None: rank 0 first
    finishes any swap a kill interrupted, then every rank reads the same folder."""
    if rank == 0:
        recover_state(folder)
    barrier()
    meta = read_state(folder)
    return meta if meta is not None and meta["fingerprint"] == fp else None
