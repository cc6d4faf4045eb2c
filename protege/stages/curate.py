"""curate: overlong filtering of the RL pool, counted in the tokens the student will see."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from protege.config import Config
from protege.data.curate import overlong_filter
from protege.models.processor import StudentProcessor
from protege.paths import BASE_MODEL, CURATED, CURATED_RL, CURATION_REPORT, SPLIT_TABLES
from protege.stages.common import say


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.curate.model_dump(), "curate.")
    run.log_input(SPLIT_TABLES["rl"], context="curate")
    processor = StudentProcessor.from_pretrained(root / BASE_MODEL)
    kept, report = overlong_filter(root / SPLIT_TABLES["rl"], processor, cfg.curate.max_tokens)
    if kept.empty:
        raise ValueError(f"curate: every row of {SPLIT_TABLES['rl']} is longer than curate.max_tokens="
                         f"{cfg.curate.max_tokens} tokens (mean {report['mean_tokens']:.1f}); raise the cap")
    out = root / CURATED
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    # the curated table is self-contained: its images travel with it
    shutil.copytree(root / SPLIT_TABLES["rl"].parent / "images" / "rl", out / "images" / "rl")
    kept.to_parquet(root / CURATED_RL, index=False)
    (root / CURATION_REPORT).parent.mkdir(parents=True, exist_ok=True)
    (root / CURATION_REPORT).write_text(json.dumps(report, indent=2))
    run.log_metrics({k: v for k, v in report.items() if isinstance(v, (int, float))})
    run.log_artifact(root / CURATION_REPORT)
    say("curate", f"kept {report['kept']}/{report['input_rows']} (dropped {report['dropped_overlong']} overlong) "
                  f"-> {CURATED_RL}")
