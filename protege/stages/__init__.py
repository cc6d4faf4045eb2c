"""Stage entry points: `protege stage NAME` and the cmd of each dvc.yaml stage.

Each stage reads its inputs from the paths in protege.paths, writes its outputs there, and records
what it did in its own MLflow run. Stages are recipes: they compose library pieces, nothing more.
"""
from __future__ import annotations

import importlib

STAGES = ("world", "mini_benchmarks", "validate", "sft", "curate", "teachers", "rollouts", "disc_pretrain", "rl",
          "rl_baseline", "merge", "agent_sft", "agent_rl", "tool_sft", "tool_rl", "evaluate", "promote")


def stage_module(name: str):
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; expected one of: {', '.join(STAGES)}")
    return importlib.import_module(f"protege.stages.{name}")
