"""A study's report: per variant the mean and 95% CI over seeds and items, the paired difference to the
baseline variant, and a verdict per claim, as reports/study/<name>.{md,json,png}. A game study's (`task:
agent` or `tool`) is built by protege.study.agent_report."""
from __future__ import annotations

import json
from pathlib import Path

from protege.study import preconditions as pre
from protege.study.cells import preconditions_section, verdict_cell
from protege.study.curves import draw, figure_path, figures_with_data, mean_curves
from protege.study.outcomes import model_result
from protege.study.spec import GAME_TASKS, Study, describe
from protege.study.stats import Part, Run, paired_difference, summarize, verdict

HEADLINE = ("world_test", "benchmark_average")
LABELS = {"world_test": "world test accuracy (%)", "benchmark_average": "benchmark average (14 mini)"}
MODEL_LABELS = {"rl_final": "the last RL checkpoint", "merged": "the merged RL checkpoints"}


def metric_parts(model_result: dict, metric: str) -> Run:
    """A run's metric as parts for the statistics: the world test split, every benchmark, or one."""
    if metric == "world_test":
        return {"world_test": Part({k: float(v) for k, v in model_result["world_test"]["correct"].items()})}
    benches = model_result["benchmarks"]
    names = list(benches) if metric == "benchmark_average" else [metric] if metric in benches else []
    return {b: Part({k: float(v) for k, v in benches[b]["units"].items()}, benches[b]["aggregate"],
                    benches[b].get("categories")) for b in names}


def _runs_of(study: Study, results: dict[str, dict], variant: str, model: str, metric: str
             ) -> tuple[list[Run], list[int]]:
    runs, seeds = [], []
    for seed in study.seeds:
        r = results.get(f"{variant}/seed-{seed}")
        if r is not None:
            parts = metric_parts(model_result(r, model), metric)
            if parts:
                runs.append(parts)
                seeds.append(seed)
    return runs, seeds


def build_report(study: Study, results: dict[str, dict], failed: list[str]) -> dict:
    """results: run key -> the run's result.json (finished runs only)."""
    if study.task in GAME_TASKS:
        from protege.study.agent_report import build_agent_report

        return build_agent_report(study, results, failed)
    n_boot = study.bootstrap
    variants = {}
    for name, v in study.variants.items():
        planned = len(study.seeds) if v.train else 1
        entry = {"train": v.train, "overrides": v.overrides, "runs_planned": planned, "metrics": {},
                 "vs_baseline": {}}
        for metric in HEADLINE:
            runs, seeds = _runs_of(study, results, name, study.model, metric)
            entry["seeds_finished"] = seeds
            if runs:
                entry["metrics"][metric] = summarize(runs, n_boot, seed=0)
            base_runs, base_seeds = _runs_of(study, results, study.baseline, study.model, metric)
            if name != study.baseline and runs and base_runs:
                try:
                    entry["vs_baseline"][metric] = paired_difference(
                        base_runs, base_seeds, runs, seeds, n_boot, seed=0,
                        once_a=not study.variants[study.baseline].train, once_b=not v.train)
                except ValueError:  # no seed finished on both sides yet
                    pass
        done = [results[f"{name}/seed-{s}"] for s in study.seeds if f"{name}/seed-{s}" in results]
        summaries = [r["rl"] for r in done if r.get("rl")]
        entry["train_rl"] = {k: sum(t[k] for t in summaries) / len(summaries)  # rl.json's quarters, mean over seeds
                             for k in sorted({k for t in summaries for k in t})
                             if k.endswith(("_first_quarter", "_last_quarter"))
                             and all(isinstance(t.get(k), (int, float)) for t in summaries)}
        variants[name] = entry

    evaluated = pre.evaluate_all(study, results)
    claims = []
    for c in study.claims:
        out = {"name": c.name, "better": c.better, "than": c.than, "metric": c.metric, "model": c.model,
               "margin": c.margin}
        better, better_seeds = _runs_of(study, results, c.better, c.model, c.metric)
        than, than_seeds = _runs_of(study, results, c.than, c.model, c.metric)
        diff = None
        if better and than:
            try:
                diff = paired_difference(than, than_seeds, better, better_seeds, n_boot, seed=0,
                                         once_a=not study.variants[c.than].train,
                                         once_b=not study.variants[c.better].train)
            except ValueError:  # no seed has finished on both sides yet
                pass
        if diff is not None:
            out.update(diff, verdict=verdict(diff["ci"], c.margin))
        else:
            out.update({"verdict": None, "missing": [v for v, r in ((c.better, better), (c.than, than)) if not r]
                        or ["a seed finished on both sides"]})
        claims.append(pre.apply(out, c, evaluated))

    runs = []
    for run in study.runs():
        r = results.get(run.key)
        row = {"key": run.key, "variant": run.variant, "seed": run.seed, "train": run.train, "finished": r is not None}
        if r is not None:
            m = model_result(r, study.model)
            row.update({"world_test": 100 * m["world_test"]["accuracy"], "benchmark_average": m["average"],
                        "seconds": r.get("seconds"), "mlflow_run_id": r.get("mlflow_run_id")})
        runs.append(row)
    curves = mean_curves(study, results)
    return {"study": study.name, "file": str(study.path), "project": str(study.project),
            "description": study.description, "seeds": study.seeds, "baseline": study.baseline, "model": study.model,
            "bootstrap": n_boot, "level": 0.95, "common": study.common, "variants": variants, "claims": claims,
            "preconditions": list(evaluated.values()), "curves": curves, "figures": figures_with_data(curves),
            "runs": runs, "failed": failed}


def headline_metrics(report: dict) -> dict[str, float]:
    out = {}
    for name, v in report["variants"].items():
        for metric, s in v["metrics"].items():
            out[f"{name}.{metric}"] = s["mean"]
    verdicts = [c["verdict"] for c in report["claims"]]
    out.update({"claims_reproduced": verdicts.count("reproduced"),
                "claims_not_reproduced": verdicts.count("not reproduced"),
                "claims_inconclusive": verdicts.count("inconclusive"),
                "claims_precondition_not_met": verdicts.count(pre.PRECONDITION_NOT_MET)})
    return out


def _cell(s: dict | None, signed: bool = False) -> str:
    if not s:
        return "—"
    fmt = "{:+.1f}" if signed else "{:.1f}"
    value = s["diff"] if "diff" in s else s["mean"]
    return f"{fmt.format(value)} [{fmt.format(s['ci'][0])}, {fmt.format(s['ci'][1])}]"


def _metric_label(metric: str) -> str:
    return LABELS.get(metric, f"{metric} score")


def markdown(report: dict) -> str:
    if report.get("task") in GAME_TASKS:
        from protege.study.agent_report import agent_markdown

        return agent_markdown(report)
    base = report["baseline"]
    finished = sum(r["finished"] for r in report["runs"])
    lines = [f"# Study `{report['study']}`", ""]
    if report["description"]:
        lines += [report["description"].strip(), ""]
    lines += [
        (f"Study file `{report['file']}`, project `{report['project']}`; seeds {report['seeds']}; "
         f"{finished} of {len(report['runs'])} runs finished. Every run trains from the project's shared "
         f"upstream artifacts (SFT checkpoint, curated questions, teacher answers, discriminator) and is "
         f"evaluated with {MODEL_LABELS.get(report['model'], report['model'])} (`{report['model']}`)."),
        "",
        (f"Scores in percent. Means are over seeds and items; 95% CIs come from a two-level bootstrap "
         f"({report['bootstrap']} replicates: seeds drawn with replacement, and the items of each benchmark or "
         f"split drawn with replacement, one draw shared by all seeds since every seed answers the same items). "
         f"Differences are paired by seed and by item. A claim \"A > B\" is **reproduced** when the CI of "
         f"A - B lies above 0, **not reproduced** when it lies below 0 (the opposite holds), and "
         f"**inconclusive** when it touches or crosses 0. A claim \"A >= B\" with a margin m is judged the same "
         f"way against -m instead of 0 (A is not worse than B by more than m points)."),
    ]
    if report["common"]:
        lines += ["", f"Overrides shared by every variant: `{describe(report['common'])}`."]
    if report["claims"]:
        lines += ["", "## Claims", "",
                  "| claim | preconditions | metric | model | A - B (points) | 95% CI | per seed | verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in report["claims"]:
            head = (f"| {c['name']} (A = `{c['better']}`, B = `{c['than']}`) | {pre.requires_cell(c)} | "
                    f"{_metric_label(c['metric'])} | {c['model']} |")
            if c["verdict"] is None:
                lines.append(f"{head} — | — | — | no result yet: {', '.join(c['missing'])} unfinished |")
                continue
            per_seed = ", ".join(f"{d:+.1f}" for d in c["per_seed"])
            verdict = verdict_cell(c, report.get("preconditions", []))
            lines.append(f"{head} {c['diff']:+.2f} | [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}] | {per_seed} | {verdict} |")
    lines += preconditions_section(report)
    lines += ["", "## Variants", "",
              f"| variant | overrides | runs | world test (%) | minus `{base}` | benchmark average | minus `{base}` |",
              "|---|---|---|---|---|---|---|"]
    for name, v in report["variants"].items():
        label = f"**{name}** (baseline)" if name == base else name
        overrides = ("train: false (the SFT checkpoint)" if not v["train"] else
                     describe(v["overrides"], "(the common overrides only)" if report["common"] else
                              "(params as they are)"))
        m, d = v["metrics"], v["vs_baseline"]
        lines.append(f"| {label} | `{overrides}` | {len(v.get('seeds_finished', []))}/{v['runs_planned']} | "
                     f"{_cell(m.get('world_test'))} | {_cell(d.get('world_test'), True)} | "
                     f"{_cell(m.get('benchmark_average'))} | {_cell(d.get('benchmark_average'), True)} |")
    lines += ["", "## Runs", "", "| run | world test (%) | benchmark average | seconds | MLflow run |",
              "|---|---|---|---|---|"]
    for r in report["runs"]:
        if r["finished"]:
            lines.append(f"| {r['key']} | {r['world_test']:.1f} | {r['benchmark_average']:.1f} | "
                         f"{r['seconds']:.0f} | {r['mlflow_run_id'] or ''} |")
        else:
            lines.append(f"| {r['key']} | not finished | | | |")
    if report["failed"]:
        lines += ["", f"Failed in this invocation: {', '.join(report['failed'])} (re-run the study to retry them)."]
    return "\n".join(lines) + "\n"


def write_figures(report: dict, md: Path) -> list[Path]:
    """The training curves' pictures next to the report's markdown (`<name>.<figure>.png`)."""
    return [draw(report["curves"], key, figure_path(md, key), report["study"]) for key in report.get("figures", [])]


def bar_chart(report: dict, path: Path) -> Path:
    if report.get("task") in GAME_TASKS:
        from protege.study.agent_report import agent_chart

        agent_chart(report, path)
        return path
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(report["variants"])
    fig, axes = plt.subplots(1, len(HEADLINE), figsize=(max(8, 1.1 * len(names) * len(HEADLINE)), 4.2))
    for ax, metric in zip(np.atleast_1d(axes), HEADLINE):
        stats = [report["variants"][n]["metrics"].get(metric) for n in names]
        means = [s["mean"] if s else np.nan for s in stats]
        err = np.array([[s["mean"] - s["ci"][0] if s else 0 for s in stats],
                        [s["ci"][1] - s["mean"] if s else 0 for s in stats]])
        colors = ["tab:orange" if n == report["baseline"] else "tab:blue" for n in names]
        ax.bar(np.arange(len(names)), means, yerr=np.clip(err, 0, None), capsize=3, color=colors)
        ax.set_xticks(np.arange(len(names)), names, rotation=45, ha="right")
        ax.set_title(_metric_label(metric))
        ax.set_ylabel("percent, 95% CI over seeds and items")
        highs = [s["ci"][1] for s in stats if s]
        ax.set_ylim(0, min(100, max(highs, default=0) * 1.15 + 1))
    fig.suptitle(f"study {report['study']} (baseline {report['baseline']}, orange)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(report: dict, paths: dict[str, Path]) -> dict[str, Path]:
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(report, indent=2, ensure_ascii=False))
    paths["md"].write_text(markdown(report))
    bar_chart(report, paths["png"])
    write_figures(report, paths["md"])
    return paths
