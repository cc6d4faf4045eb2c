"""A few SFT steps on a table whose images, decoded together, would take far more memory than training needs;
prints the process's peak memory growth as JSON. Launched by test_image_batches.py in a fresh process, so
the peak (ru_maxrss) is this run's alone.

    python -m tests.stages.memory_worker BASE TABLE WORKERS [--hold]

--hold decodes every row first and keeps the images, as rows did before they held paths: the figure to
compare with.
"""
import argparse
import json
import resource
import sys
from pathlib import Path

import torch

from protege.config import SFTConfig
from protege.data.rows import load_rows
from protege.models.student import load_student
from protege.train.sft import train_sft


def peak_mib(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def status_mib(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def limit_data(more_mib: int) -> None:
    """At most `more_mib` MiB more of private writable memory (brk and anonymous mmap) than this process has
    now, for this process and the workers it forks: memory past it fails to allocate (MemoryError)."""
    cap = int((status_mib("VmData") + more_mib) * 2**20)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, resource.getrlimit(resource.RLIMIT_DATA)[1]))


def main(base: Path, table: Path, workers: int, hold: bool, more_mib: int | None) -> dict:
    torch.set_num_threads(1)
    model, processor = load_student(base)
    cfg = SFTConfig(steps=3, batch_size=2, lr=1e-3, warmup_steps=0, log_every=1, save_every=100, device="cpu")
    # a step on small images first: what training itself costs (weights, optimizer, activations) is paid
    # before the measured part begins
    train_sft(model, processor, load_rows(table.parent / "small.parquet"), cfg.model_copy(update={"steps": 1}),
              seed=0)
    start_peak, start_rss = peak_mib(), status_mib("VmRSS")
    if more_mib is not None:
        limit_data(more_mib)
    rows = load_rows(table)
    held = [r.image for r in rows] if hold else []
    losses = []
    train_sft(model, processor, rows, cfg, seed=0, workers=workers, on_log=lambda s, m: losses.append(m["loss"]))
    return {"growth_mib": peak_mib() - start_peak, "start_rss_mib": start_rss, "start_peak_mib": start_peak,
            "workers_peak_mib": peak_mib(resource.RUSAGE_CHILDREN), "rows": len(rows), "held": len(held),
            "losses": losses}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("table", type=Path)
    ap.add_argument("workers", type=int)
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--limit-mib", type=int, help="RLIMIT_DATA: this many MiB above what is in use after warm-up")
    a = ap.parse_args()
    json.dump(main(a.base, a.table, a.workers, a.hold, a.limit_mib), sys.stdout)
