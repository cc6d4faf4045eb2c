"""Small helpers shared by stage recipes."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rich.console import Console

from protege import tracking
from protege.paths import STAGE_METRICS
from protege.progress import Progress

console = Console(stderr=True, soft_wrap=True)  # long lines stay whole in logs


def say(stage: str, message: str) -> None:
    console.print(f"[bold cyan]{stage}[/] {message}")


def progress(stage: str, run, what: str, total: int | None) -> Progress:
    """A stage's long pass over rows: done / total, rate and time left, printed every few seconds and logged
    as `{what}_done`, `{what}_per_s`, `{what}_left_s` (step: rows done)."""
    return Progress(what, total, lambda line: say(stage, line), lambda values, step: run.log_metrics(values, step=step))


def step_logger(stage: str, run, every_print: int = 1):
    """Logs per-step metrics to MLflow and prints a progress line."""
    def log(step: int, metrics: dict) -> None:
        run.log_metrics(metrics, step=step)
        shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        if step % every_print == 0:
            say(stage, f"step {step}: {shown}")
    return log


class StepHistory:
    """A training run's logged metrics, one row per step (`step` first), in a CSV rewritten after every step
    (DVC plots it; a study reads its runs' curves from it). A resumed run keeps the rows up to the step it
    resumes after, so the file covers the whole run however often it was killed; `path` None keeps the rows in
    memory only (a rank that does not write)."""

    def __init__(self, path: Path | None, resumed_after: int = 0):
        self.path, self.rows = path, []
        if resumed_after and path is not None and path.exists() and path.stat().st_size:
            import pandas as pd

            old = pd.read_csv(path)
            if "step" in old:
                self.rows = [{k: (int(v) if k == "step" else v) for k, v in r.items() if not pd.isna(v)}
                             for r in old[old["step"] <= resumed_after].to_dict("records")]
        self._write()

    def add(self, step: int, metrics: dict) -> None:
        self.rows = [r for r in self.rows if r["step"] < step] + [{"step": step, **metrics}]
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        import pandas as pd

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        pd.DataFrame(self.rows, columns=None if self.rows else ["step"]).to_csv(tmp, index=False)
        tmp.replace(self.path)


QuietRun = tracking.QuietRun  # the stages that train pick it for ranks > 0 themselves too


def inputs_digest(root: Path, rels: list, extra: list[str] | None = None) -> str:
    """Identifies the files a training run starts from by content (`tracking.input_digest`): a resume state
    from other inputs is not resumed, and one in a copied or re-cloned project is."""
    parts = [tracking.input_digest(root, rel) for rel in rels] + list(extra or [])
    return hashlib.sha256(json.dumps([str(r) for r in rels] + parts).encode()).hexdigest()[:16]


def write_stage_metrics(root: Path, stage: str, metrics: dict) -> Path:
    path = root / STAGE_METRICS / f"{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return path
