"""An agent study's report (`task: agent`): per variant the success rate, policy entropy and format-error
rate on the held-out layouts at the start (the warm start) and the end of RL, with 95% CIs over seeds and
layouts, the paired difference to the baseline, and the training rollouts' first and last quarter."""
from __future__ import annotations

from protege.study.spec import AGENT_METRICS, Study, describe
from protege.study.stats import Part, Run, paired_difference, summarize

LABELS = {"success": "success rate (%)", "entropy": "entropy (nats/token)", "format_errors": "format errors (% of turns)"}
POINTS = {"start": "warm start", "end": "last RL checkpoint", "merged_teacher": "merged teacher"}


def agent_parts(evaluation: dict, metric: str) -> Run:
    """One evaluation's per-layout scores as a statistics part (unit = held-out seed)."""
    eps = evaluation["per_episode"]
    if metric == "success":
        return {"success": Part({str(e["seed"]): float(e["success"]) for e in eps})}
    if metric == "format_errors":
        return {"format_errors": Part({str(e["seed"]): e["format_errors"] / max(e["turns"], 1) for e in eps})}
    if metric == "entropy":
        return {"entropy": Part({str(e["seed"]): float(e["entropy"]) for e in eps}, percent=False)}
    raise ValueError(f"unknown agent metric {metric!r}; expected one of {AGENT_METRICS}")


def _point(model: str) -> str:
    from protege.study.runner import AGENT_MODELS

    return AGENT_MODELS.get(model, model)


def _runs_of(study: Study, results: dict[str, dict], variant: str, point: str, metric: str):
    runs, seeds = [], []
    for seed in study.seeds:
        r = results.get(f"{variant}/seed-{seed}")
        if r is None:
            continue
        ev = r["agent"].get(point) or (r["agent"]["start"] if not r["train"] else None)
        if ev is not None:
            runs.append(agent_parts(ev, metric))
            seeds.append(seed)
    return runs, seeds


def _diff(study: Study, results: dict, a: str, b: str, point: str, metric: str) -> dict | None:
    ra, sa = _runs_of(study, results, a, point, metric)
    rb, sb = _runs_of(study, results, b, point, metric)
    if not ra or not rb:
        return None
    try:
        return paired_difference(ra, sa, rb, sb, study.bootstrap, seed=0, once_a=not study.variants[a].train,
                                 once_b=not study.variants[b].train)
    except ValueError:  # no seed finished on both sides yet
        return None


def build_agent_report(study: Study, results: dict[str, dict], failed: list[str]) -> dict:
    end = _point(study.model)
    variants = {}
    for name, v in study.variants.items():
        entry = {"train": v.train, "overrides": v.overrides, "runs_planned": len(study.seeds) if v.train else 1,
                 "metrics": {}, "vs_baseline": {}, "train_rollouts": {}}
        for metric in AGENT_METRICS:
            for point in ("start", end):
                runs, seeds = _runs_of(study, results, name, point, metric)
                entry["seeds_finished"] = seeds
                if runs:
                    entry["metrics"][f"{metric}.{point}"] = summarize(runs, study.bootstrap, seed=0)
            if name != study.baseline and (d := _diff(study, results, study.baseline, name, end, metric)):
                entry["vs_baseline"][metric] = d
        done = [results[f"{name}/seed-{s}"] for s in study.seeds if f"{name}/seed-{s}" in results]
        rollouts = [r["agent"]["train"] for r in done if r["agent"].get("train")]
        for key in sorted({k for t in rollouts for k in t}):
            vals = [t[key] for t in rollouts if key in t]
            entry["train_rollouts"][key] = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals),
                                            "seeds": len(vals)}
        variants[name] = entry
    claims = []
    for c in study.claims:
        out = {"name": c.name, "better": c.better, "than": c.than, "metric": c.metric, "model": c.model}
        d = _diff(study, results, c.than, c.better, _point(c.model), c.metric)
        out.update(d if d is not None else {"verdict": None, "missing": ["a seed finished on both sides"]})
        claims.append(out)
    runs = []
    for run in study.runs():
        r = results.get(run.key)
        row = {"key": run.key, "variant": run.variant, "seed": run.seed, "train": run.train, "finished": r is not None}
        if r is not None:
            for point in ("start", end):
                ev = r["agent"].get(point)
                if ev is not None:
                    row[f"success.{point}"] = 100 * ev["success_rate"]
                    row[f"entropy.{point}"] = ev["entropy"]
            row.update({"seconds": r.get("seconds"), "mlflow_run_id": r.get("mlflow_run_id")})
        runs.append(row)
    return {"study": study.name, "task": "agent", "file": str(study.path), "project": str(study.project),
            "description": study.description, "seeds": study.seeds, "baseline": study.baseline, "model": study.model,
            "end": end, "bootstrap": study.bootstrap, "level": 0.95, "common": study.common, "variants": variants,
            "claims": claims, "runs": runs, "failed": failed}


def _cell(s: dict | None, signed: bool = False, digits: int = 1) -> str:
    if not s:
        return "—"
    v = s["diff"] if "diff" in s else s["mean"]
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"{f.format(v)} [{f.format(s['ci'][0])}, {f.format(s['ci'][1])}]"


def agent_markdown(report: dict) -> str:
    end, base = report["end"], report["baseline"]
    finished = sum(r["finished"] for r in report["runs"])
    lines = [f"# Agent study `{report['study']}`", ""]
    if report["description"]:
        lines += [report["description"].strip(), ""]
    lines += [
        (f"Study file `{report['file']}`; seeds {report['seeds']}; {finished} of {len(report['runs'])} runs "
         f"finished. Every run starts from the project's warm start (models/agent_sft) and is evaluated greedily "
         f"on the same held-out layouts at the start and with the {POINTS.get(end, end)} (`{end}`)."),
        "",
        (f"Means over seeds and layouts with 95% CIs from a two-level bootstrap ({report['bootstrap']} "
         "replicates: seeds and layouts drawn with replacement); differences to the baseline are paired by seed "
         "and layout. Success and format errors in percent, entropy in nats per policy token."),
        "",
        f"| variant | success start | success end | Δ success vs {base} | entropy start | entropy end | "
        f"Δ entropy | format errors end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, v in report["variants"].items():
        m, d = v["metrics"], v["vs_baseline"]
        lines.append(f"| {name}{' (baseline)' if name == base else ''} | {_cell(m.get('success.start'))} | "
                     f"{_cell(m.get(f'success.{end}'))} | {_cell(d.get('success'), True)} | "
                     f"{_cell(m.get('entropy.start'), digits=3)} | {_cell(m.get(f'entropy.{end}'), digits=3)} | "
                     f"{_cell(d.get('entropy'), True, 3)} | {_cell(m.get(f'format_errors.{end}'))} |")
    lines += ["", "Training rollouts (sampled, mean over seeds, [min, max]): first and last quarter of the steps.", "",
              "| variant | success first | success last | entropy first | entropy last | format errors last |",
              "|---|---|---|---|---|---|"]
    for name, v in report["variants"].items():
        t = v["train_rollouts"]
        if not t:
            continue

        def c(key, scale=100.0, digits=1):
            s = t.get(key)
            return "—" if not s else (f"{scale * s['mean']:.{digits}f} [{scale * s['min']:.{digits}f}, "
                                      f"{scale * s['max']:.{digits}f}]")
        lines.append(f"| {name} | {c('success_rate_first_quarter')} | {c('success_rate_last_quarter')} | "
                     f"{c('entropy_first_quarter', 1, 3)} | {c('entropy_last_quarter', 1, 3)} | "
                     f"{c('format_error_rate_last_quarter')} |")
    lines += ["", "## Variants", ""]
    for name, v in report["variants"].items():
        lines.append(f"- `{name}`: {describe(v['overrides'])}" + ("" if v["train"] else " (no RL: the warm start)"))
    if report["claims"]:
        lines += ["", "## Claims", ""]
        for c in report["claims"]:
            lines.append(f"- {c['name']} ({c['metric']}): " + (f"**{c['verdict']}**, {_cell(c, True, 3 if c['metric'] == 'entropy' else 1)}"
                                                              if c.get("verdict") else "no result yet"))
    if report["failed"]:
        lines += ["", f"Failed in this invocation: {', '.join(report['failed'])} (re-run the study to retry them)."]
    return "\n".join(lines) + "\n"


def agent_chart(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names, end = list(report["variants"]), report["end"]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(names) * 2), 4.2))
    for ax, metric in zip(axes, ("success", "entropy")):
        for k, (point, color) in enumerate((("start", "tab:gray"), (end, "tab:blue"))):
            stats = [report["variants"][n]["metrics"].get(f"{metric}.{point}") for n in names]
            means = [s["mean"] if s else np.nan for s in stats]
            err = np.array([[s["mean"] - s["ci"][0] if s else 0 for s in stats],
                            [s["ci"][1] - s["mean"] if s else 0 for s in stats]])
            ax.bar(np.arange(len(names)) + 0.4 * k, means, 0.4, yerr=np.clip(err, 0, None), capsize=3, color=color,
                   label=POINTS.get(point, point))
        ax.set_xticks(np.arange(len(names)) + 0.2, names, rotation=30, ha="right")
        ax.set_title(LABELS[metric])
        ax.legend()
    fig.suptitle(f"agent study {report['study']} (95% CI over seeds and layouts)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
