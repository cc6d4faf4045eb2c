"""The claims of every part of a study file in one markdown table (`make results` -> reports/results.md):
per claim the measured difference, its 95% CI and the verdict, then the figures behind each verdict (the
compared variants' own scores, and where the run started from), read from the parts' reports."""
from __future__ import annotations

from pathlib import Path

from protege.study import preconditions as pre
from protege.study.cells import preconditions_section, verdict_cell
from protege.study.spec import GAME_TASKS, Suite

QA_METRICS = ("world_test", "benchmark_average")


def _metric_name(task: str, metric: str) -> str:
    if task in GAME_TASKS:
        from protege.study.agent_report import METRICS

        return METRICS[metric].label
    from protege.study.report import LABELS

    return LABELS.get(metric, f"{metric} score")


def _digits(task: str, metric: str) -> int:
    if task in GAME_TASKS:
        from protege.study.agent_report import METRICS

        return METRICS[metric].digits
    return 1


def _fmt(s: dict | None, digits: int, signed: bool = False) -> str:
    if not s:
        return "—"
    v = s["diff"] if "diff" in s else s["mean"]
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"{f.format(v)} [{f.format(s['ci'][0])}, {f.format(s['ci'][1])}]"


def _claim_row(part: str, task: str, c: dict, evaluated: list[dict] | None = None) -> str:
    digits = _digits(task, c["metric"])
    relation = ">=" if c.get("margin") else ">"
    what = f"{c['name']} (`{c['better']}` {relation} `{c['than']}`" + (f", margin {c['margin']:g})" if c.get("margin")
                                                                        else ")")
    head = f"| {part} | {what} | {pre.requires_cell(c)} | {_metric_name(task, c['metric'])} |"
    if c.get("verdict") is None:
        missing = ", ".join(c.get("missing", [])) or "runs"
        return f"{head} — | — | no result yet ({missing} unfinished) |"
    difference = c.get("difference", f"{c['better']} - {c['than']}")
    return (f"{head} {difference}: {c['diff']:+.{digits}f} | [{c['ci'][0]:+.{digits}f}, {c['ci'][1]:+.{digits}f}] "
            f"({len(c.get('pairs', []))} seed pairs) | {verdict_cell(c, evaluated or [])} |")


def suite_figure(suite: Suite, part: str, key: str) -> Path:
    """A part's curve picture beside the file's report: reports/results.md -> reports/results.<part>.<key>.png."""
    md = suite.report_paths()["md"]
    return md.with_name(f"{md.stem}.{part}.{key}.png")


def _figures(report: dict) -> list[str]:
    """Each variant's own scores: what a verdict rests on (a tie at a ceiling, a collapse, a start that
    leaves no headroom)."""
    task = report.get("task", "qa")
    out = []
    for name, v in report["variants"].items():
        m = v["metrics"]
        if task in GAME_TASKS:
            end = report["end"]
            keys = [k for k in ("success", "accuracy", "entropy", "format_errors", "runtime_errors", "tool_calls")
                    if f"{k}.start" in m or f"{k}.{end}" in m]
            cells = []
            for k in keys:
                d = _digits(task, k)
                start, last = m.get(f"{k}.start"), m.get(f"{k}.{end}")
                cells.append(f"{k.replace('_', ' ')} {_fmt(start, d)}" + (f" -> {_fmt(last, d)}" if v["train"] else ""))
            runs = f"{len(v.get('seeds_finished', []))}/{v['runs_planned']} runs"
            out.append(f"- `{name}` ({runs}): " + "; ".join(cells))
        else:
            cells = [f"{_metric_name(task, k)} {_fmt(m.get(k), 1)}" for k in QA_METRICS if k in m]
            runs = f"{len(v.get('seeds_finished', []))}/{v['runs_planned']} runs"
            train = v.get("train_rl", {})
            moves = [f"{k.removesuffix('_first_quarter').replace('_', ' ')} {train[k]:.3f} -> "
                     f"{train[k.replace('_first_quarter', '_last_quarter')]:.3f}" for k in train
                     if k.endswith("_first_quarter") and k.replace("_first_quarter", "_last_quarter") in train]
            out.append(f"- `{name}` ({runs}): " + ("; ".join(cells) or "no finished run")
                       + (f". Training, first -> last quarter of the steps: {'; '.join(moves)}" if moves else ""))
    return out


def _mean(report: dict, variant: str, key: str) -> float | None:
    s = report["variants"].get(variant, {}).get("metrics", {}).get(key)
    return s["mean"] if s else None


def _reading(report: dict, c: dict) -> str:
    """For a claim that did not reproduce: what was measured, in a sentence (the compared variants' own
    levels, where they started, and the training signal that explains a tie)."""
    task, better, than = report.get("task", "qa"), c["better"], c["than"]
    out = []
    if task in GAME_TASKS:
        metric, end, d = c["metric"], report["end"], _digits(task, c["metric"])
        start = _mean(report, better, f"{metric}.start")
        b, t = _mean(report, better, f"{metric}.{end}"), _mean(report, than, f"{metric}.{end}")
        if None not in (start, b, t):
            out.append(f"from a warm start at {start:.{d}f}, `{better}` ends at {b:.{d}f} and `{than}` at {t:.{d}f} "
                       f"({_metric_name(task, metric)})")
        e0, eb, et = (_mean(report, than, "entropy.start"), _mean(report, better, f"entropy.{end}"),
                      _mean(report, than, f"entropy.{end}"))
        if metric != "entropy" and None not in (e0, eb, et):
            out.append(f"entropy {e0:.3f} -> `{better}` {eb:.3f}, `{than}` {et:.3f}")
        if None not in (e0, et) and et > e0:
            out.append(f"`{than}`'s entropy rose ({e0:.3f} -> {et:.3f}) instead of collapsing")
    else:
        metric = c["metric"]
        levels = {v: _mean(report, v, metric) for v in report["variants"]}
        fixed = [v for v, e in report["variants"].items() if not e["train"] and levels[v] is not None]
        shown = [f"`{v}` {levels[v]:.1f}" for v in dict.fromkeys([better, than, *fixed]) if levels.get(v) is not None]
        if shown:
            out.append(f"{_metric_name(task, metric)}: " + ", ".join(shown))
        for v in (better, than):
            train = report["variants"].get(v, {}).get("train_rl", {})
            first, last = train.get("disc_accuracy_first_quarter"), train.get("disc_accuracy_last_quarter")
            ranked = train.get("disc_auroc_last_quarter")
            if first is not None and last is not None and max(abs(first - 0.5), abs(last - 0.5)) < 0.1:
                if ranked is not None and ranked >= 0.6:  # its scores still order the answers, off the threshold
                    out.append(f"`{v}`'s discriminator was near chance at its threshold (accuracy {first:.2f} -> "
                               f"{last:.2f}) yet still ranked student above teacher answers (AUROC {ranked:.2f} in "
                               "the last quarter), a signal the binary similarity cannot read")
                else:
                    shown = "" if ranked is None else f", AUROC {ranked:.2f} in the last quarter"
                    out.append(f"`{v}`'s discriminator stayed near chance (accuracy {first:.2f} -> {last:.2f}"
                               f"{shown}), so its similarity reward carried no signal")
        for v in (better, than):
            if report["variants"].get(v, {}).get("train") and fixed and None not in (levels.get(v), levels[fixed[0]]):
                out.append(f"RL moved `{v}` {levels[v] - levels[fixed[0]]:+.1f} points from `{fixed[0]}`")
    return "; ".join(out)


def suite_markdown(suite: Suite, reports: dict[str | None, dict | None]) -> str:
    lines = [f"# Results: `{suite.name}`", ""]
    if suite.description:
        lines += [suite.description.strip(), ""]
    lines += [
        (f"From `{suite.path.name}` in `{suite.project}`: {len(suite.studies)} studies, each from the project's "
         "shared upstream artifacts. Differences are paired by seed and by item or held-out episode; 95% CIs "
         "come from a two-level bootstrap (seeds and items drawn with replacement). A claim \"A > B\" is "
         "**reproduced** when the CI of A - B lies above 0, **not reproduced** when it lies below 0 (the "
         "opposite holds), **inconclusive** when it touches or crosses 0; \"A >= B\" with a margin m is judged "
         "against -m instead. For error rates the difference is B - A (fewer is better). A claim may require "
         "preconditions, measured in the runs by a criterion fixed in the study file (each part's section below); "
         "when one is not met the claim reads **precondition not met**, with the measurement, instead of a "
         "verdict."),
        "",
        "| study | claim | preconditions | metric | difference | 95% CI | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for study in suite.studies:
        report = reports.get(study.part)
        if report is None:
            lines.append(f"| {study.part} | (no report yet: run the study) | | | | | |")
            continue
        for c in report["claims"]:
            lines.append(_claim_row(study.part or study.name, report.get("task", "qa"), c,
                                    report.get("preconditions", [])))
    for study in suite.studies:
        report = reports.get(study.part)
        if report is None:
            continue
        finished = sum(r["finished"] for r in report["runs"])
        lines += ["", f"## {study.part}: {report.get('task', 'qa')} study `{report['study']}`", ""]
        if report.get("description"):
            lines += [report["description"].strip(), ""]
        lines += [f"{finished} of {len(report['runs'])} runs finished; the full report: "
                  f"`reports/study/{report['study']}.md`. Each variant (mean over seeds, 95% CI"
                  + ("; warm start -> last RL checkpoint" if report.get("task") in GAME_TASKS else "") + "):", ""]
        lines += _figures(report)
        unreproduced = [c for c in report["claims"] if c.get("verdict") not in (None, "reproduced")]
        for c in unreproduced:
            if reading := _reading(report, c):
                lines += ["", f"{c['name']}: {c['verdict']}. Measured: {reading}."]
        part = study.part or study.name
        lines += preconditions_section(report, {key: suite_figure(suite, part, key).name
                                                for key in report.get("figures", [])}, level="###")
        if report.get("failed"):
            lines += ["", f"Failed in the last invocation: {', '.join(report['failed'])}."]
    return "\n".join(lines) + "\n"
