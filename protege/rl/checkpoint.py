"""Training state for exact resume, without pickle: tensors in safetensors, the rest in JSON.

A state folder holds the policy's tensors, the discriminator, both optimizers'
tensors and hyper-parameters, the torch / python RNG states, the data cursor and the step. It is written
to a temporary folder and renamed into place, so a kill leaves the previous state intact.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def optimizer_to_files(opt: torch.optim.Optimizer, folder: Path, name: str) -> None:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.contiguous()
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
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_state(folder: Path, *, step: int, policy, disc, opt, disc_opt, py_rng: random.Random,
               cursor: dict, fingerprint: str) -> None:
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, str(tmp / "policy.safetensors"))
    if disc is not None:
        save_file({k: v.contiguous() for k, v in disc.state_dict().items()}, str(tmp / "discriminator.safetensors"))
    if disc_opt is not None:  # absent when the discriminator is fixed
        optimizer_to_files(disc_opt, tmp, "disc_optimizer")
    optimizer_to_files(opt, tmp, "optimizer")
    save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    version, internal, gauss = py_rng.getstate()
    (tmp / "state.json").write_text(json.dumps({"step": step, "cursor": cursor, "fingerprint": fingerprint,
                                                "python_rng": [version, list(internal), gauss]}))
    if folder.exists():  # swap: the old state is removed only after the new one is complete
        old = folder.with_name(folder.name + ".old")
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old)
    else:
        os.replace(tmp, folder)


def read_state(folder: Path) -> dict | None:
    if not (folder / "state.json").exists():
        return None
    return json.loads((folder / "state.json").read_text())


def restore_state(folder: Path, meta: dict, *, policy, disc, opt, disc_opt, py_rng: random.Random) -> None:
    policy.load_state_dict(load_file(str(folder / "policy.safetensors")))
    if disc is not None and (folder / "discriminator.safetensors").exists():
        disc.load_state_dict(load_file(str(folder / "discriminator.safetensors")))
    if disc_opt is not None and (folder / "disc_optimizer.json").exists():
        optimizer_from_files(disc_opt, folder, "disc_optimizer")
    optimizer_from_files(opt, folder, "optimizer")
    torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
    version, internal, gauss = meta["python_rng"]
    py_rng.setstate((version, tuple(internal), gauss))
