"""Uniform average of checkpoints: M = (1/K) sum_k c_k, tensor by tensor (a `linear` merge with equal weights)."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from protege.merging.config import MergeConfig, ModelInput
from protege.merging.io import INDEX, SINGLE
from protege.merging.methods import METHODS
from protege.merging.streaming import merge_folders, merge_state_dicts

WEIGHTS = SINGLE


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """(1/K) sum_k states[k], accumulated in float64; integer buffers are the first state's."""
    if not states:
        raise ValueError("nothing to merge: no state dicts given")
    return merge_state_dicts("linear", states, parameters={"weight": 1.0, "normalize": True}, dtype=torch.float64)


def merge_uniform(checkpoints: list[Path], out_dir: Path) -> Path:
    """Averages the checkpoint folders into out_dir (replaced if present), streamed tensor by tensor; the
    other files (config, tokenizer, ...) are the last checkpoint's."""
    if not checkpoints:
        raise ValueError("nothing to merge: no checkpoints given")
    for c in checkpoints:
        if not (c / WEIGHTS).exists() and not (c / INDEX).exists():
            raise FileNotFoundError(f"{c}: neither {WEIGHTS} nor {INDEX} (only safetensors checkpoints are merged)")
    models = [ModelInput(Path(c).resolve(), f"checkpoints[{i}]", {"weight": 1.0}) for i, c in enumerate(checkpoints)]
    last = models[-1].path
    cfg = MergeConfig(source="merge (uniform average)", method="linear", info=METHODS["linear"], models=models,
                      base=None, parameters={"normalize": True}, dtype=None, out_dtype=None, dtype_name=None,
                      out_dtype_name=None, donor=last, tokenizer_folder=last)
    out_dir = Path(out_dir)
    merge_folders(cfg, out_dir, overwrite=True)
    for sub in last.iterdir():  # as before: the last checkpoint's folders come along too
        if sub.is_dir() and not (out_dir / sub.name).exists():
            shutil.copytree(sub, out_dir / sub.name)
    return out_dir
