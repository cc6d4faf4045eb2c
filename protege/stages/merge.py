"""merge: a soup of the RL run's checkpoints with the configured method (merge.method and merge.parameters,
or a mergekit YAML at merge.config), streamed tensor by tensor; methods with a base merge task vectors
relative to the SFT checkpoint. The merged checkpoint is evaluated next to the last one."""
from __future__ import annotations

import shutil
from pathlib import Path

from protege import provenance
from protege.config import Config, ConfigError, read_yaml_file, tracked_params
from protege.errors import UserFacingError
from protege.merging.config import parse_config
from protege.merging.methods import METHODS
from protege.merging.streaming import merge_folders
from protege.paths import MERGED_MODEL, RL_CHECKPOINTS, SFT_MODEL, checkpoints
from protege.stages.common import say

SIDE_KEYS = ("parameters", "dtype", "out_dtype")  # what a merge.config YAML contributes


def merge_spec(cfg: Config, root: Path, found: list[Path]) -> tuple[dict, str]:
    """The mergekit-style document for this run's checkpoints, and where its settings came from."""
    m = cfg.merge
    if m.config is not None:
        path = root / m.config
        if not path.is_file():
            raise UserFacingError(f"params.yaml: merge.config: {m.config} is not a file in the project")
        try:  # the project's YAML reader: a syntax error or a key given twice names the file and line
            doc, _ = read_yaml_file(path, "merge config")
        except ConfigError as exc:
            raise UserFacingError(str(exc)) from None
        if not isinstance(doc, dict) or "merge_method" not in doc:
            raise UserFacingError(f"{m.config}: expected a mergekit YAML mapping with merge_method")
        if "slices" in doc:
            raise UserFacingError(f"{m.config}: slices: the merge stage soups this run's RL checkpoints whole (its "
                                  "config gives merge_method, parameters, dtype and out_dtype); merge layer ranges "
                                  "with `protege merge CONFIG OUT`")
        method = doc["merge_method"]
        spec = {k: doc[k] for k in SIDE_KEYS if k in doc}
        source = m.config
    else:
        method = "linear" if m.method == "uniform" else m.method
        params = {"weight": 1.0, "normalize": True} if m.method == "uniform" else dict(m.parameters)
        spec = {"parameters": params} if params else {}
        source = "params.yaml merge"
    info = METHODS.get(method)
    models = found[-1:] if method == "slerp" else found
    spec.update(merge_method=method, models=[{"model": str(c)} for c in models])
    if info is not None and info.needs_base:
        spec["base_model"] = str(root / SFT_MODEL)
    return spec, source


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(tracked_params(cfg.merge), "merge.")
    run.log_input(RL_CHECKPOINTS, context="checkpoints")
    found = checkpoints(root / RL_CHECKPOINTS)
    if not found:
        raise FileNotFoundError(f"merge: no checkpoints under {RL_CHECKPOINTS}; run the rl stage first")
    spec, source = merge_spec(cfg, root, found)
    merge_cfg = parse_config(spec, source=source, config_dir=root)
    out = root / MERGED_MODEL
    merge_folders(merge_cfg, out, seed=cfg.merge.seed, overwrite=True)
    if cfg.merge.config is not None:  # the settings this soup came from travel with it
        shutil.copy(root / cfg.merge.config, out / "merge_config.yaml")
    provenance.write(out)  # this stage's record, not the one copied from an input checkpoint
    method = spec["merge_method"]
    run.log_metrics({"checkpoints_merged": len(spec["models"])})
    run.log_model(out, "merged", params={"method": method, "checkpoints": ",".join(Path(m["model"]).name
                                                                                   for m in spec["models"])})
    say("merge", f"{method} of {len(spec['models'])} checkpoints"
                 + (" (task vectors from the SFT checkpoint)" if "base_model" in spec else "") + f" -> {MERGED_MODEL}")
