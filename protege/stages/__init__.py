"""Stage entry points: `protege stage NAME` and the cmd of each dvc.yaml stage.

Each stage reads its inputs from the paths in protege.paths, writes its outputs there, and records
what it did in its own MLflow run. Stages are recipes: they compose library pieces, nothing more.
"""
from __future__ import annotations

import importlib

from protege.stage_names import STAGES


def stage_module(name: str):
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; expected one of: {', '.join(STAGES)}")
    return importlib.import_module(f"protege.stages.{name}")
