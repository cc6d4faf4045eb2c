"""Checkpoint merging (model soups), mergekit-compatible.

- `methods`: one tensor name at a time (linear, task_arithmetic, ties, dare_linear, dare_ties, breadcrumbs,
  breadcrumbs_ties, slerp, model_stock, passthrough; ema for in-RL merging), with mergekit's semantics and defaults;
- `config`: mergekit-style YAML (`models:` and `slices:` forms), validated, parameters resolved per tensor;
- `layers`: where the decoder layers are in tensor names (no architecture tables);
- `plan`: what each output tensor is made of (slices: layer ranges, renumbering), in mergekit's order;
- `streaming`: `merge_folders` (safetensors folders, streamed, sharded output) and `merge_state_dicts`;
- `uniform`: the pipeline's uniform average (`merge_uniform`, `average_state_dicts`).
"""
from protege.merging.config import MergeConfig, MergeConfigError, layer_positions, load_config, parse_config
from protege.merging.io import Checkpoint, CheckpointError, parse_size
from protege.merging.methods import (METHODS, bernoulli_prune, breadcrumbs, breadcrumbs_ties, dare_linear, dare_ties,
                                     ema, generalized_task_arithmetic, linear, magnitude_outliers_prune,
                                     magnitude_prune, merge_tensor, model_stock, passthrough, sign_consensus_mask,
                                     slerp, task_arithmetic, ties)
from protege.merging.streaming import DEFAULT_MAX_SHARD_BYTES, merge_folders, merge_state_dicts
from protege.merging.uniform import average_state_dicts, merge_uniform

__all__ = [
    "METHODS", "Checkpoint", "CheckpointError", "DEFAULT_MAX_SHARD_BYTES", "MergeConfig", "MergeConfigError",
    "average_state_dicts", "bernoulli_prune", "breadcrumbs", "breadcrumbs_ties", "dare_linear", "dare_ties", "ema",
    "generalized_task_arithmetic", "layer_positions", "linear", "load_config", "magnitude_outliers_prune",
    "magnitude_prune", "merge_folders", "merge_state_dicts", "merge_tensor", "merge_uniform", "model_stock",
    "parse_config", "parse_size", "passthrough", "sign_consensus_mask", "slerp", "task_arithmetic", "ties",
]
