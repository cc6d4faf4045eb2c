"""Preconditions: what must hold in a variant's runs before a claim that requires it gets a verdict. A method
that fixes a failure can only be judged where the failure happens (GTR-Turbo's merged teacher against plain
RL's thought collapse), and a signal can only be credited where it carries information (RIL's discriminator).

Each precondition is measured on every finished seed of its variant, from the run's result: a training
curve (`curve`: one row per step, the stage's train_curve.csv) or an upstream stage's figure
(`upstream_metrics`, e.g. disc_pretrain.heldout_auroc, the same for every seed). Kinds, with the criterion
fixed in the study file before anything runs:

- `collapse`: start = the mean of the curve's first `window` points, end = the mean of its last `window`
  points (at least 2 x window points needed). direction down: met when end <= ratio x start and/or end <=
  threshold (every one given must hold); up: end >= ratio x start and/or end >= threshold.
- `at_least_part_of_run`: met when metric >= than, and metric > 0, at `points` or more of the steps where
  both were measured (a curve every rl.eval_every steps); a tie at zero counts for nothing.
- `above`: met when the value > threshold; `between`: met when lo <= value <= hi. A curve's value is its
  `at` (first | last) point; an upstream figure is the figure.

A seed without the data (no curve, the metric never logged, too few points) is "not measured" and counts as
not met. Over the seeds (`seeds`): majority (default) is met when more than half of the finished seeds met it;
all when every finished seed did. No finished seed: the precondition is "not measured". A claim whose required
preconditions are not all met gets the verdict "precondition not met" instead of its statistical verdict.
"""
from __future__ import annotations

import math

from protege.study.spec import Claim, Precondition, Study

MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"
PRECONDITION_NOT_MET = "precondition not met"


def curve(result: dict, metric: str) -> list[tuple[int, float]]:
    """(step, value) of `metric` in the run's per-step curve, by step; steps where it was not logged left out."""
    rows = result.get("curve") or []
    out = [(int(r["step"]), float(r[metric])) for r in rows if isinstance(r.get(metric), (int, float))
           and not math.isnan(float(r[metric]))]
    return sorted(out)


def upstream(result: dict, metric: str) -> float | None:
    """`stage.key` from the run's recorded upstream figures (None: absent)."""
    stage, _, key = metric.partition(".")
    value = (result.get("upstream_metrics") or {}).get(stage, {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _value(pre: Precondition, result: dict) -> tuple[float | None, int | None]:
    if "." in pre.metric:
        return upstream(result, pre.metric), None
    points = curve(result, pre.metric)
    if not points:
        return None, None
    step, value = points[0] if pre.at == "first" else points[-1]
    return value, step


def measure(pre: Precondition, result: dict) -> dict:
    """One run's measurement: {"met": True | False | None (not measured), ... the figures it rests on}."""
    if pre.kind == "collapse":
        points = curve(result, pre.metric)
        if len(points) < 2 * pre.window:
            return {"met": None, "why": f"{len(points)} curve points of {pre.metric} (needs {2 * pre.window})"}
        start = sum(v for _, v in points[:pre.window]) / pre.window
        end = sum(v for _, v in points[-pre.window:]) / pre.window
        down = pre.direction == "down"
        checks = []
        if pre.ratio is not None:
            checks.append(end <= pre.ratio * start if down else end >= pre.ratio * start)
        if pre.threshold is not None:
            checks.append(end <= pre.threshold if down else end >= pre.threshold)
        return {"met": all(checks), "start": start, "end": end, "start_step": points[0][0], "end_step": points[-1][0]}
    if pre.kind == "at_least_part_of_run":
        a, b = dict(curve(result, pre.metric)), dict(curve(result, pre.than or ""))
        steps = sorted(set(a) & set(b))
        if not steps:
            return {"met": None, "why": f"no step with both {pre.metric} and {pre.than}"}
        # a tie at zero (neither solves anything) shows no teacher worth following: it does not count
        ahead = [s for s in steps if a[s] >= b[s] and a[s] > 0]
        return {"met": len(ahead) >= pre.points, "points": len(steps), "ahead": len(ahead), "steps": ahead,
                "max_gap": max(a[s] - b[s] for s in steps)}
    value, step = _value(pre, result)
    if value is None:
        return {"met": None, "why": f"{pre.metric} not recorded"}
    met = value > pre.threshold if pre.kind == "above" else pre.lo <= value <= pre.hi  # type: ignore[operator]
    return {"met": met, "value": value, **({"step": step} if step is not None else {})}


def criterion(pre: Precondition) -> str:
    """The criterion in words, as fixed in the study file."""
    if pre.kind == "collapse":
        sign = "<=" if pre.direction == "down" else ">="
        parts = ([f"{sign} {pre.ratio:g} x start"] if pre.ratio is not None else []) + \
                ([f"{sign} {pre.threshold:g}"] if pre.threshold is not None else [])
        span = "point" if pre.window == 1 else f"{pre.window} points"
        return (f"{pre.metric} {'falls' if pre.direction == 'down' else 'rises'}: end {' and '.join(parts)} "
                f"(start, end: the mean of the curve's first, last {span})")
    if pre.kind == "at_least_part_of_run":
        return (f"{pre.metric} >= {pre.than} and > 0 at {pre.points} or more curve "
                f"point{'s' if pre.points > 1 else ''}")
    where = "" if "." in pre.metric else f" at the {pre.at} step"
    if pre.kind == "above":
        return f"{pre.metric}{where} > {pre.threshold:g}"
    return f"{pre.metric}{where} in [{pre.lo:g}, {pre.hi:g}]"


def shown(m: dict) -> str:
    """A measurement in a few characters: '0.91 -> 0.38', '2 of 4 points', '0.64', or why it is missing."""
    if m["met"] is None:
        return f"not measured ({m['why']})"
    if "start" in m:
        return f"{m['start']:.3g} -> {m['end']:.3g}"
    if "points" in m:
        return f"{m['ahead']} of {m['points']} points"
    return f"{m['value']:.3g}"


def evaluate(study: Study, pre: Precondition, results: dict[str, dict]) -> dict:
    """The precondition over its variant's finished seeds: per seed the measurement, met on k of n, status."""
    per_seed = {}
    for seed in study.seeds:
        r = results.get(f"{pre.variant}/seed-{seed}")
        if r is not None:
            per_seed[str(seed)] = measure(pre, r)
    n = len(per_seed)
    k = sum(m["met"] is True for m in per_seed.values())
    measured = sum(m["met"] is not None for m in per_seed.values())
    if not measured:
        status = NOT_MEASURED
    else:
        status = MET if (k == n if pre.seeds == "all" else 2 * k > n) else NOT_MET
    return {"name": pre.name, "variant": pre.variant, "metric": pre.metric, "kind": pre.kind,
            "criterion": criterion(pre), "seeds_rule": pre.seeds, "per_seed": per_seed, "met_on": k, "seeds": n,
            "status": status}


def evaluate_all(study: Study, results: dict[str, dict]) -> dict[str, dict]:
    return {p.name: evaluate(study, p, results) for p in study.preconditions}


def apply(out: dict, claim: Claim, evaluated: dict[str, dict]) -> dict:
    """A claim's row with its required preconditions; a verdict becomes "precondition not met" when one of
    them is not met (the difference and CI stay in the row, as measured)."""
    out["requires"] = [{"name": n, "status": evaluated[n]["status"], "met_on": evaluated[n]["met_on"],
                        "seeds": evaluated[n]["seeds"]} for n in claim.requires]
    unmet = [r["name"] for r in out["requires"] if r["status"] != MET]
    if unmet and out.get("verdict") is not None:
        out["verdict"] = PRECONDITION_NOT_MET
        out["unmet"] = unmet
    return out


def requires_cell(c: dict) -> str:
    """A claim's preconditions in a table cell: '`name` met (3/3 seeds)', or '—' when it requires none."""
    parts = []
    for r in c.get("requires", []):
        status = r["status"] if r["status"] == MET else f"**{r['status']}**"
        parts.append(f"`{r['name']}` {status}" + (f" ({r['met_on']}/{r['seeds']} seeds)" if r["seeds"] else ""))
    return "; ".join(parts) or "—"


def unmet_detail(c: dict, evaluated: list[dict]) -> str:
    """What an unmet precondition measured, for the claim's verdict cell."""
    by_name = {p["name"]: p for p in evaluated}
    out = []
    for name in c.get("unmet", []):
        p = by_name.get(name)
        if p is not None:
            seeds = ", ".join(shown(m) for m in p["per_seed"].values()) or "no finished run"
            out.append(f"{name}: {seeds}; needs {p['criterion']}")
    return "; ".join(out)


def markdown_table(evaluated: list[dict]) -> list[str]:
    """The preconditions section of a report: each with its criterion, per-seed measurement and status."""
    if not evaluated:
        return []
    lines = ["| precondition | variant | criterion (fixed in the study file) | measured per seed | status |",
             "|---|---|---|---|---|"]
    for p in evaluated:
        seeds = "; ".join(f"seed {s}: {shown(m)}" + ("" if m["met"] is None else f" ({MET if m['met'] else NOT_MET})")
                          for s, m in p["per_seed"].items()) or "no finished run"
        rule = "more than half of the seeds" if p["seeds_rule"] == "majority" else "every seed"
        lines.append(f"| `{p['name']}` | `{p['variant']}` | {p['criterion']} | {seeds} | **{p['status']}** "
                     f"(on {p['met_on']} of {p['seeds']} seeds; needs {rule}) |")
    return lines
