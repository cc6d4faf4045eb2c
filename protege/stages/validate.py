"""validate: the Great Expectations suite on every dataset; a failure stops the pipeline here."""
from __future__ import annotations

from pathlib import Path

from protege.config import Config
from protege.data.rows import REQUIRED_COLUMNS, check_parquet_table
from protege.data.validate import DatasetInvalid, summary_frame, validate_tables
from protege.paths import REQUIRED_SPLITS, SPLITS, VALIDATION_REPORT, split_table
from protege.stages.common import say


def run(cfg: Config, root: Path, run) -> None:
    import json

    # val may be left out of your files (no learning curve); the world always writes it
    rels = {s: split_table(cfg.data.source, s) for s in SPLITS}
    rels = {s: r for s, r in rels.items() if s in REQUIRED_SPLITS or cfg.data.source == "world" or (root / r).exists()}
    tables = [root / p for p in rels.values()]
    for split, rel in rels.items():  # each table readable, with its columns, before anything is logged
        check_parquet_table(root / rel, REQUIRED_COLUMNS, what=f"'{split}' split", shown=rel)
    for rel in rels.values():
        run.log_input(rel, context="validate")
    report, failures = validate_tables(tables)
    # report paths relative to the project, as users know them
    report["files"] = {str(Path(f).relative_to(root)) if Path(f).is_absolute() else f: v
                       for f, v in report["files"].items()}
    out = root / VALIDATION_REPORT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    run.log_artifact(out)
    run.log_metrics({"failed_expectations": len(failures),
                     "rows": sum(v["rows"] for v in report["files"].values())})
    summary_frame(report).to_csv(root / "reports" / "validation_summary.csv", index=False)
    if failures:
        lines = [f.line().replace(str(root) + "/", "") for f in failures]
        raise DatasetInvalid("validation failed; no later stage will run:\n" + "\n".join(lines))
    say("validate", f"{len(tables)} files passed {len(report['files'][next(iter(report['files']))]['expectations'])} "
                    f"expectations each -> {VALIDATION_REPORT}")
