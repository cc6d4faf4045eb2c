"""A game study's report (`task: agent` or `task: tool`): per variant the game's metrics on its held-out
episodes at the start (the warm start) and the end of RL, with 95% CIs over seeds and held-out episodes, the
paired difference to the baseline, the claims, and the training rollouts' first and last quarter.

agent (the grid game, held-out layouts): success rate, policy entropy, format-error rate.
tool (the tool environment, held-out questions): accuracy, runtime-error rate (episodes with at least one
failed tool call), tool calls per episode, policy entropy.

For the metrics where lower is better (format errors, runtime errors) a claim "A better than B" is checked on
B - A, so that a reproduced claim always means A did better."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protege.stages.games import GAMES
from protege.study import preconditions as pre
from protege.study.cells import preconditions_section, verdict_cell
from protege.study.curves import figures_with_data, mean_curves
from protege.study.outcomes import AGENT_MODELS, game_summary
from protege.study.spec import GAME_METRICS, LOWER_IS_BETTER, Study, describe
from protege.study.stats import Part, Run, paired_difference, summarize, verdict

POINTS = {"start": "warm start", "end": "last RL checkpoint", "merged_teacher": "merged teacher"}


@dataclass(frozen=True)
class Metric:
    label: str                              # chart title
    name: str                               # in the markdown's columns and claims
    score: Callable[[dict], float]          # one held-out episode's row -> its score
    percent: bool = True                    # scores in [0, 1] shown in percent; False: figures of their own
    digits: int = 1


METRICS = {
    "success": Metric("success rate (%)", "success", lambda e: float(e["success"])),
    "accuracy": Metric("accuracy (%)", "accuracy", lambda e: float(e["success"])),
    "entropy": Metric("entropy (nats/token)", "entropy", lambda e: float(e["entropy"]), percent=False, digits=3),
    "format_errors": Metric("format errors (% of turns)", "format errors",
                            lambda e: e["format_errors"] / max(e["turns"], 1)),
    # an indicator per episode: its mean is the evaluation's runtime_error_rate
    "runtime_errors": Metric("runtime-error rate (% of episodes)", "runtime-error rate",
                             lambda e: float(e["runtime_errors"] > 0)),
    "tool_calls": Metric("tool calls per episode", "tool calls", lambda e: float(e["tool_calls"]), percent=False,
                         digits=2),
}
LABELS = {k: m.label for k, m in METRICS.items()}


@dataclass(frozen=True)
class View:
    """What a game's markdown shows: the variants table's columns (metric, point: start | end | delta), the
    training rollouts' columns (summary key, header, scale, digits) and the chart's panels."""
    title: str
    units: str
    columns: tuple[tuple[str, str], ...]
    rollouts: tuple[tuple[str, str, float, int], ...]
    chart: tuple[str, ...]


VIEWS = {
    "agent": View(
        "Agent study", "Success and format errors in percent, entropy in nats per policy token.",
        (("success", "start"), ("success", "end"), ("success", "delta"), ("entropy", "start"), ("entropy", "end"),
         ("entropy", "delta"), ("format_errors", "end")),
        (("success_rate_first_quarter", "success first", 100, 1), ("success_rate_last_quarter", "success last", 100, 1),
         ("entropy_first_quarter", "entropy first", 1, 3), ("entropy_last_quarter", "entropy last", 1, 3),
         ("format_error_rate_last_quarter", "format errors last", 100, 1)),
        ("success", "entropy")),
    "tool": View(
        "Tool study",
        "Accuracy and runtime-error rate (the share of episodes with at least one failed tool call) in percent, "
        "tool calls per episode, entropy in nats per policy token.",
        (("accuracy", "start"), ("accuracy", "end"), ("accuracy", "delta"), ("runtime_errors", "start"),
         ("runtime_errors", "end"), ("runtime_errors", "delta"), ("tool_calls", "start"), ("tool_calls", "end"),
         ("entropy", "end")),
        (("success_rate_first_quarter", "accuracy first", 100, 1),
         ("success_rate_last_quarter", "accuracy last", 100, 1),
         ("runtime_error_rate_first_quarter", "runtime-error rate first", 100, 1),
         ("runtime_error_rate_last_quarter", "runtime-error rate last", 100, 1),
         ("tool_calls_per_episode_last_quarter", "tool calls last", 1, 2),
         ("shaping_reward_mean_last_quarter", "shaping reward last", 1, 3)),
        ("accuracy", "runtime_errors", "tool_calls")),
}


def game_parts(evaluation: dict, metric: str) -> Run:
    """One evaluation's per-episode scores as a statistics part (unit = held-out seed)."""
    if metric not in METRICS:
        raise ValueError(f"unknown game metric {metric!r}; expected one of {', '.join(METRICS)}")
    m = METRICS[metric]
    return {metric: Part({str(e["seed"]): m.score(e) for e in evaluation["per_episode"]}, percent=m.percent)}



def _point(model: str) -> str:
    return AGENT_MODELS.get(model, model)


def _summary(result: dict) -> dict:
    return game_summary(result) or {}


def _runs_of(study: Study, results: dict[str, dict], variant: str, point: str, metric: str):
    runs, seeds = [], []
    for seed in study.seeds:
        r = results.get(f"{variant}/seed-{seed}")
        if r is None:
            continue
        summary = _summary(r)
        ev = summary.get(point) or (summary.get("start") if not r["train"] else None)
        if ev is not None:
            runs.append(game_parts(ev, metric))
            seeds.append(seed)
    return runs, seeds


def _diff(study: Study, results: dict, a: str, b: str, point: str, metric: str) -> dict | None:
    """b - a on `metric` at `point`, paired by seed and held-out episode."""
    ra, sa = _runs_of(study, results, a, point, metric)
    rb, sb = _runs_of(study, results, b, point, metric)
    if not ra or not rb:
        return None
    try:
        return paired_difference(ra, sa, rb, sb, study.bootstrap, seed=0, once_a=not study.variants[a].train,
                                 once_b=not study.variants[b].train)
    except ValueError:  # no seed finished on both sides yet
        return None


def _by_kind(study: Study, results: dict, variant: str, point: str) -> dict[str, dict]:
    """Accuracy per question kind (tool game): mean over seeds of each run's accuracy on that kind."""
    per_seed: dict[str, list[float]] = {}
    for seed in study.seeds:
        r = results.get(f"{variant}/seed-{seed}")
        summary = _summary(r) if r is not None else {}
        ev = summary.get(point) or (summary.get("start") if r is not None and not r["train"] else None)
        for kind, acc in (ev or {}).get("accuracy_by_kind", {}).items():
            per_seed.setdefault(kind, []).append(100 * acc)
    return {k: {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "seeds": len(v)} for k, v in per_seed.items()}


def build_agent_report(study: Study, results: dict[str, dict], failed: list[str]) -> dict:
    """The report of a game study (agent or tool); results: run key -> result.json (finished runs only)."""
    game, end = study.task, _point(study.model)
    metrics = GAME_METRICS[game]
    variants = {}
    for name, v in study.variants.items():
        entry = {"train": v.train, "overrides": v.overrides, "runs_planned": len(study.seeds) if v.train or study.warm_start_seeds else 1,
                 "metrics": {}, "vs_baseline": {}, "train_rollouts": {}}
        for metric in metrics:
            for point in ("start", end):
                runs, seeds = _runs_of(study, results, name, point, metric)
                entry["seeds_finished"] = seeds
                if runs:
                    entry["metrics"][f"{metric}.{point}"] = summarize(runs, study.bootstrap, seed=0)
            if name != study.baseline and (d := _diff(study, results, study.baseline, name, end, metric)):
                entry["vs_baseline"][metric] = d
        if game == "tool":
            entry["accuracy_by_kind"] = {p: k for p in ("start", end) if (k := _by_kind(study, results, name, p))}
        done = [results[f"{name}/seed-{s}"] for s in study.seeds if f"{name}/seed-{s}" in results]
        rollouts = [_summary(r)["train"] for r in done if _summary(r).get("train")]
        for key in sorted({k for t in rollouts for k in t}):
            vals = [t[key] for t in rollouts if key in t]
            entry["train_rollouts"][key] = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals),
                                            "seeds": len(vals)}
        variants[name] = entry
    evaluated = pre.evaluate_all(study, results)
    claims = []
    for c in study.claims:
        lower = c.metric in LOWER_IS_BETTER
        out = {"name": c.name, "better": c.better, "than": c.than, "metric": c.metric, "model": c.model,
               "margin": c.margin, "difference": f"{c.than} - {c.better}" if lower else f"{c.better} - {c.than}"}
        d = (_diff(study, results, c.better, c.than, _point(c.model), c.metric) if lower else
             _diff(study, results, c.than, c.better, _point(c.model), c.metric))
        out.update({**d, "verdict": verdict(d["ci"], c.margin)} if d is not None else
                   {"verdict": None, "missing": ["a seed finished on both sides"]})
        claims.append(pre.apply(out, c, evaluated))
    runs = []
    for run in study.runs():
        r = results.get(run.key)
        row = {"key": run.key, "variant": run.variant, "seed": run.seed, "train": run.train, "finished": r is not None}
        if r is not None:
            for point in ("start", end):
                ev = _summary(r).get(point)
                if ev is not None:
                    row[f"{metrics[0]}.{point}"] = 100 * ev["success_rate"]
                    row[f"entropy.{point}"] = ev["entropy"]
                    if "runtime_error_rate" in ev:
                        row[f"runtime_errors.{point}"] = 100 * ev["runtime_error_rate"]
                        row[f"tool_calls.{point}"] = ev["tool_calls_per_episode"]
            row.update({"seconds": r.get("seconds"), "mlflow_run_id": r.get("mlflow_run_id")})
        runs.append(row)
    curves = mean_curves(study, results)
    return {"study": study.name, "task": game, "file": str(study.path), "project": str(study.project),
            "description": study.description, "seeds": study.seeds, "baseline": study.baseline, "model": study.model,
            "end": end, "bootstrap": study.bootstrap, "level": 0.95, "common": study.common, "variants": variants,
            "claims": claims, "preconditions": list(evaluated.values()), "curves": curves,
            "figures": figures_with_data(curves), "runs": runs, "failed": failed}


def _cell(s: dict | None, signed: bool = False, digits: int = 1) -> str:
    if not s:
        return "—"
    v = s["diff"] if "diff" in s else s["mean"]
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"{f.format(v)} [{f.format(s['ci'][0])}, {f.format(s['ci'][1])}]"


def _c(t: dict, key: str, scale: float, digits: int) -> str:
    s = t.get(key)
    return "—" if not s else (f"{scale * s['mean']:.{digits}f} [{scale * s['min']:.{digits}f}, "
                              f"{scale * s['max']:.{digits}f}]")


def agent_markdown(report: dict) -> str:
    """The markdown of a game study's report (agent or tool)."""
    game = report.get("task", "agent")
    view, layout = VIEWS[game], GAMES[game]
    end, base, what = report["end"], report["baseline"], layout.what
    finished = sum(r["finished"] for r in report["runs"])
    lines = [f"# {view.title} `{report['study']}`", ""]
    if report["description"]:
        lines += [report["description"].strip(), ""]
    lines += [
        (f"Study file `{report['file']}`; seeds {report['seeds']}; {finished} of {len(report['runs'])} runs "
         f"finished. Every run starts from the project's warm start ({layout.sft_model.as_posix()}) and is "
         f"evaluated greedily on the same held-out {what} at the start and with the {POINTS.get(end, end)} "
         f"(`{end}`)."),
        "",
        (f"Means over seeds and {what} with 95% CIs from a two-level bootstrap ({report['bootstrap']} "
         f"replicates: seeds and {what} drawn with replacement); differences to the baseline (variant - "
         f"{base}) are paired by seed and {what[:-1]}. {view.units}"),
        "",
    ]
    head = ["variant"]
    for metric, point in view.columns:
        m = METRICS[metric]
        head.append(f"Δ {m.name} vs {base}" if point == "delta" else f"{m.name} {point}")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in report["variants"].items():
        row = [f"{name}{' (baseline)' if name == base else ''}"]
        for metric, point in view.columns:
            digits = METRICS[metric].digits
            if point == "delta":
                row.append(_cell(v["vs_baseline"].get(metric), True, digits))
            else:
                row.append(_cell(v["metrics"].get(f"{metric}.{end if point == 'end' else point}"), digits=digits))
        lines.append("| " + " | ".join(row) + " |")
    kinds = sorted({k for v in report["variants"].values() for k in v.get("accuracy_by_kind", {}).get(end, {})}
                   | {k for v in report["variants"].values() if not v["train"]
                      for k in v.get("accuracy_by_kind", {}).get("start", {})})
    if kinds:
        lines += ["", f"Accuracy by question kind with the {POINTS.get(end, end)} (the warm start for a variant "
                      "without RL), in percent: mean over seeds [min, max].", "",
                  "| variant | " + " | ".join(kinds) + " |", "|" + "---|" * (len(kinds) + 1)]
        for name, v in report["variants"].items():
            by = v.get("accuracy_by_kind", {})
            k = by.get(end) or (by.get("start") if not v["train"] else None) or {}
            lines.append(f"| {name} | " + " | ".join(_c(k, kind, 1, 1) for kind in kinds) + " |")
    lines += ["", "Training rollouts (sampled, mean over seeds, [min, max]): first and last quarter of the steps.", "",
              "| variant | " + " | ".join(h for _, h, _, _ in view.rollouts) + " |",
              "|" + "---|" * (len(view.rollouts) + 1)]
    for name, v in report["variants"].items():
        if v["train_rollouts"]:
            lines.append(f"| {name} | " + " | ".join(_c(v["train_rollouts"], key, scale, digits)
                                                      for key, _, scale, digits in view.rollouts) + " |")
    lines += ["", "## Variants", ""]
    for name, v in report["variants"].items():
        lines.append(f"- `{name}`: {describe(v['overrides'])}" + ("" if v["train"] else " (no RL: the warm start)"))
    if report["claims"]:
        lines += ["", "## Claims", "",
                  "A claim \"A better than B\" is **reproduced** when the 95% CI of the paired difference lies above "
                  "0, **not reproduced** when it lies below 0 (B did better), **inconclusive** otherwise; the "
                  "difference is A - B, or B - A where lower is better (" +
                  ", ".join(METRICS[m].name for m in LOWER_IS_BETTER if m in GAME_METRICS[game]) + "). A claim with "
                  "a margin m (\"A at least as good as B\") is judged the same way against -m instead of 0.", ""]
        for c in report["claims"]:
            m = METRICS[c["metric"]]
            lower = c["metric"] in LOWER_IS_BETTER
            what_diff = c.get("difference") or f"{c['better']} - {c['than']}"
            needs = f"; preconditions: {pre.requires_cell(c)}" if c.get("requires") else ""
            lines.append(f"- {c['name']} ({m.name}{', lower is better' if lower else ''}; {what_diff}{needs}): "
                         + (f"{verdict_cell(c, report.get('preconditions', []))}, {_cell(c, True, m.digits)}"
                            if c.get("verdict") else "no result yet"))
    lines += preconditions_section(report)
    if report["failed"]:
        lines += ["", f"Failed in this invocation: {', '.join(report['failed'])} (re-run the study to retry them)."]
    return "\n".join(lines) + "\n"


def agent_chart(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    game = report.get("task", "agent")
    panels = VIEWS[game].chart
    names, end = list(report["variants"]), report["end"]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4 * len(panels), 1.6 * len(names) * len(panels)), 4.2))
    for ax, metric in zip(np.atleast_1d(axes), panels):
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
    fig.suptitle(f"{game} study {report['study']} (95% CI over seeds and held-out {GAMES[game].what})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
