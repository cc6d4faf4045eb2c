"""merge: uniform average of the RL run's checkpoints."""
from __future__ import annotations

from pathlib import Path

from protege.config import Config
from protege.merging.uniform import merge_uniform
from protege.paths import MERGED_MODEL, RL_CHECKPOINTS, checkpoints
from protege.stages.common import say


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.merge.model_dump(), "merge.")
    run.log_input(RL_CHECKPOINTS, context="checkpoints")
    found = checkpoints(root / RL_CHECKPOINTS)
    if not found:
        raise FileNotFoundError(f"merge: no checkpoints under {RL_CHECKPOINTS}; run the rl stage first")
    merge_uniform(found, root / MERGED_MODEL)
    run.log_metrics({"checkpoints_merged": len(found)})
    run.log_model(root / MERGED_MODEL, "merged", params={"method": cfg.merge.method,
                                                         "checkpoints": ",".join(c.name for c in found)})
    say("merge", f"{cfg.merge.method} average of {len(found)} checkpoints -> {MERGED_MODEL}")
