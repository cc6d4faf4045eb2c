"""Uniform average of checkpoints: M = (1/K) sum_k c_k, tensor by tensor."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    keys = set(states[0])
    for i, s in enumerate(states[1:], start=1):
        if set(s) != keys:
            raise ValueError(f"checkpoint {i} has different tensors than checkpoint 0: "
                             f"{sorted(keys ^ set(s))[:5]}")
    out = {}
    for k in states[0]:
        if states[0][k].is_floating_point():
            acc = torch.zeros_like(states[0][k], dtype=torch.float64)
            for s in states:
                acc += s[k].to(torch.float64)
            out[k] = (acc / len(states)).to(states[0][k].dtype)
        else:
            out[k] = states[0][k].clone()
    return out


def merge_uniform(checkpoints: list[Path], out_dir: Path) -> Path:
    if not checkpoints:
        raise ValueError("nothing to merge: no checkpoints given")
    for c in checkpoints:
        if not (c / WEIGHTS).exists():
            raise FileNotFoundError(f"{c}: {WEIGHTS} missing (only single-file safetensors checkpoints are merged)")
    merged = average_state_dicts([load_file(str(c / WEIGHTS)) for c in checkpoints])
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(checkpoints[-1], out_dir, ignore=shutil.ignore_patterns(WEIGHTS))
    save_file(merged, str(out_dir / WEIGHTS), metadata={"format": "pt"})
    return out_dir
