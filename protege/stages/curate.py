"""curate: overlong filtering, then log-probability sampling of the RL pool with the SFT student."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from protege.config import Config, tracked_params
from protege.data.curate import (
    answer_logprobs,
    histogram,
    plot_histograms,
    select_balanced,
    select_by_logprob,
    with_token_lengths,
)
from protege.data.loader import workers_of_rank
from protege.data.rows import image_paths, load_rows

from protege.paths import (
    CURATED,
    CURATED_RL,
    CURATION_PLOTS,
    CURATION_REPORT,
    SFT_MODEL,
    split_table,
)
from protege.stages.common import progress, say
from protege.stages.student_model import load_model


def run(cfg: Config, root: Path, run) -> None:
    c = cfg.curate
    run.log_params(tracked_params(c), "curate.")
    pool_rel = split_table(cfg.data.source, "rl")
    run.log_input(pool_rel, context="pool")
    run.log_input(SFT_MODEL, context="scorer")
    model, processor = load_model(cfg, root / SFT_MODEL)
    table = root / pool_rel
    rows = {r.id: r for r in load_rows(table)}
    processor.check_images(rows.values(), str(pool_rel))
    df = with_token_lengths(table, processor, progress=progress("curate", run, "rows_measured", len(rows)).reached)
    over = df["tokens"] > c.max_tokens
    pool = df[~over].reset_index(drop=True)
    if pool.empty:
        raise ValueError(f"curate: every row of {pool_rel} is longer than curate.max_tokens="
                         f"{c.max_tokens} tokens (mean {df['tokens'].mean():.1f}); raise the cap")
    logprobs = np.array(answer_logprobs(model, processor, [rows[i] for i in pool["id"]], c.batch_size,
                                        progress=progress("curate", run, "rows_scored", len(pool)).reached,
                                        workers=workers_of_rank(cfg.data.workers)))
    if c.balance:  # a row without a closed answer set (free text) is balanced by kind only
        kinds = pool["kind"] if "kind" in pool else [""] * len(pool)
        closed = pool["candidates"].map(lambda v: bool(json.loads(v or "[]"))) if "candidates" in pool else \
            [False] * len(pool)
        strata = [(str(kd), str(a) if has else "") for kd, a, has in zip(kinds, pool["answer"], closed)]
        keep = select_balanced(logprobs, strata, c.select, c.rule, c.tau, c.buckets, cfg.seed)
    else:
        keep = select_by_logprob(logprobs, c.select, c.rule, c.tau, c.buckets, cfg.seed)
    pool = pool.assign(logprob=logprobs)
    chosen = pool.iloc[keep].reset_index(drop=True)

    out = root / CURATED
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # the curated table is self-contained: the images of its rows travel with it, at the same relative paths;
    # an import with images in place names them by absolute path, and they stay where they are
    for rel in sorted({p for rec in chosen.to_dict("records") for p in image_paths(rec)}):
        if Path(rel).is_absolute():
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(table.parent / rel, out / rel)
    chosen.to_parquet(root / CURATED_RL, index=False)

    report = {"rule": c.rule, "tau": c.tau, "buckets": c.buckets, "input_rows": len(df),
              "dropped": {"overlong": int(over.sum()), "not_selected": len(pool) - len(chosen)},
              "kept": len(chosen), "max_tokens": c.max_tokens,
              "mean_logprob_pool": float(logprobs.mean()), "mean_logprob_selected": float(chosen["logprob"].mean()),
              "mean_tokens_pool": float(df["tokens"].mean()), "mean_tokens_selected": float(chosen["tokens"].mean())}
    (root / CURATION_REPORT).parent.mkdir(parents=True, exist_ok=True)
    (root / CURATION_REPORT).write_text(json.dumps(report, indent=2))
    plots = root / CURATION_PLOTS
    plots.mkdir(parents=True, exist_ok=True)
    hists = {"logprob": histogram(list(logprobs), list(chosen["logprob"])),
             "tokens": histogram([float(t) for t in df["tokens"]], [float(t) for t in chosen["tokens"]])}
    for name, h in hists.items():
        h.to_csv(plots / f"{name}.csv", index=False)
    plot_histograms(hists, plots / "histograms.png")
    run.log_metrics({"kept": len(chosen), "dropped_overlong": int(over.sum()),
                     "dropped_not_selected": len(pool) - len(chosen),
                     "mean_logprob_pool": report["mean_logprob_pool"],
                     "mean_logprob_selected": report["mean_logprob_selected"]})
    run.log_artifact(root / CURATION_REPORT)
    run.log_artifact(plots, "curation")
    say("curate", f"kept {len(chosen)}/{len(df)} ({int(over.sum())} overlong, {len(pool) - len(chosen)} not "
                  f"selected by {c.rule}); mean log-prob {report['mean_logprob_pool']:.3f} in the pool -> "
                  f"{report['mean_logprob_selected']:.3f} selected")
