"""mini_benchmarks: the world's mini versions of the 14 RIL benchmarks, each in its real file layout.

With real benchmark files this stage is not needed: set evaluate.benchmarks to their paths.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from protege.config import Config
from protege.bench.items import BENCHMARKS
from protege.eval.suite import mini_file
from protege.eval.writers import write_benchmark
from protege.paths import MINI_BENCHMARKS, WORLD
from protege.stages.common import say, write_stage_metrics
from protege.world.benchmarks import FORMATS, make_mini_benchmark


def run(cfg: Config, root: Path, run) -> None:
    run.log_params({"mini_items": cfg.evaluate.mini_items, "seed": cfg.world.seed}, "mini_benchmarks.")
    # an image the student trained on must not reappear in a benchmark
    avoid = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (root / WORLD / "images").rglob("*.png")}
    out = root / MINI_BENCHMARKS
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    metrics = {}
    for name in BENCHMARKS:
        items = make_mini_benchmark(name, cfg.world.seed, cfg.world.image_size, cfg.evaluate.mini_items, avoid)
        path = write_benchmark(name, items, root / mini_file(name), FORMATS[name])
        metrics[f"items_{name}"] = len(items)
        say("mini_benchmarks", f"{name}: {len(items)} items -> {path.relative_to(root)}")
    run.log_metrics(metrics)
    write_stage_metrics(root, "mini_benchmarks", metrics)
