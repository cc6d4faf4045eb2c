"""Training state for exact resume, without pickle: tensors in safetensors, the rest in JSON.

A state folder holds the policy's tensors, the discriminator, both optimizers' tensors and
hyper-parameters, the torch / python RNG states, the data cursor and the step. It is written to a
temporary folder and renamed into place, so a kill leaves the previous state intact.

Under DeepSpeed every rank takes part: rank 0 writes the full weights and the JSON, each rank writes its
own ZeRO partition of the optimizer state and its own torch RNG state (ranks sample different questions,
so their generators drift apart). DeepSpeed's own save_checkpoint is not used because its loader
unpickles what it reads; this format never does.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CPU = torch.device("cpu")


def optimizer_to_files(opt: torch.optim.Optimizer, folder: Path, name: str) -> None:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps({"param_groups": sd["param_groups"], "scalars": scalars}))


def optimizer_from_files(opt: torch.optim.Optimizer, folder: Path, name: str) -> None:
    meta = json.loads((folder / f"{name}.json").read_text())
    tensors = load_file(str(folder / f"{name}.safetensors"))
    state: dict[int, dict] = {}
    for key, v in list(tensors.items()) + list(meta["scalars"].items()):
        pid, k = key.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    # load_state_dict moves each moment onto its parameter's device
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _rng_tensors(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"torch": torch.get_rng_state()}
    if device.type == "cuda":  # sampling on the GPU draws from the CUDA generator
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def save_state(folder: Path, *, step: int, policy, disc, updater, disc_updater, py_rng: random.Random,
               cursor: dict, fingerprint: str, device: torch.device = CPU,
               rank: int = 0, world_size: int = 1, barrier=lambda: None) -> None:
    """Collective under DeepSpeed: every rank calls it. `updater` / `disc_updater` come from updaters.py."""
    tmp = folder.with_name(folder.name + ".tmp")
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    policy_sd = updater.full_state_dict()
    disc_sd = None
    if disc is not None:
        disc_sd = (disc_updater.full_state_dict() if disc_updater is not None
                   else {k: v.detach().cpu().contiguous() for k, v in disc.state_dict().items()})
    updater.save_optimizer(tmp, "optimizer", rank)
    if disc_updater is not None:  # absent when the discriminator is fixed
        disc_updater.save_optimizer(tmp, "disc_optimizer", rank)
    save_file(_rng_tensors(device), str(tmp / f"rng-rank{rank}.safetensors"))
    if rank == 0:
        save_file(policy_sd, str(tmp / "policy.safetensors"))
        if disc_sd is not None:
            save_file(disc_sd, str(tmp / "discriminator.safetensors"))
    barrier()  # every rank's files are in tmp
    if rank == 0:
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


def restore_state(folder: Path, meta: dict, *, policy, disc, updater, disc_updater, py_rng: random.Random,
                  device: torch.device = CPU, rank: int = 0) -> None:
    updater.load_weights(load_file(str(folder / "policy.safetensors")))
    if disc is not None and (folder / "discriminator.safetensors").exists():
        disc_sd = load_file(str(folder / "discriminator.safetensors"))
        if disc_updater is not None:
            disc_updater.load_weights(disc_sd)
        else:
            disc.load_state_dict(disc_sd)
    if disc_updater is not None:  # same params (fingerprint) -> the state has its optimizer too
        disc_updater.load_optimizer(folder, "disc_optimizer", rank)
    updater.load_optimizer(folder, "optimizer", rank)
    rng = load_file(str(folder / f"rng-rank{rank}.safetensors"))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], device)
    version, internal, gauss = meta["python_rng"]
    py_rng.setstate((version, tuple(internal), gauss))
