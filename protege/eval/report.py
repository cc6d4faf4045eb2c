"""The evaluation report: markdown tables and a bar chart from the report dict the evaluate stage writes.

report = {"suite", "protocol", "bootstrap", "benchmarks": {name: file}, "candidate", "score",
          "models": {model: {"average", "average_ci", "benchmarks": {name: summary}, "mean_tokens",
                             "mean_latency_s", "seconds_per_answer", "world_test"?: world_summary(...)}},
          "differences"?: {"B - A": {"a", "b", "world_test": paired_bootstrap(...), "average": {...}}}}

World test figures are fractions (0-1); benchmark scores and every difference are in percent / points.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from protege.eval.compare import compare, read_units
from protege.eval.judging import JudgeTally
from protege.bench.items import Unit
from protege.eval.stats import bootstrap_ci, paired_bootstrap


def suite_label(ev) -> str:
    """What the average was taken over: promote compares only averages over the same suite."""
    if ev.benchmarks == "mini":
        return "mini"
    return "files:" + ",".join(sorted(ev.benchmarks))


def new_report(ev, files: dict[str, Path], candidate: str) -> dict:
    """The report skeleton for an evaluation config (`evaluate` section) and its benchmark files."""
    return {"suite": suite_label(ev), "protocol": ev.protocol, "bootstrap": ev.bootstrap,
            "benchmarks": {n: str(p) for n, p in files.items()}, "candidate": candidate, "models": {}}


def model_metrics(summary: dict, prefix: str = "") -> dict[str, float]:
    """A model's headline figures for MLflow (none of the benchmarks' when no benchmark was scored)."""
    if not summary["benchmarks"]:
        return {}
    return {f"{prefix}average": summary["average"], f"{prefix}mean_tokens": summary["mean_tokens"],
            f"{prefix}mean_latency_s": summary["mean_latency_s"],
            **{f"{prefix}{b}.score": s["score"] for b, s in summary["benchmarks"].items()}}


def normalise_answer(text: str) -> str:
    """Case, surrounding spaces and punctuation, inner whitespace: "The  Red." and "the red" are one answer."""
    return " ".join(re.sub(r"[^\w\s.-]", " ", text.lower()).split()).strip(".")


def best_constant(references: list[str]) -> tuple[str, float]:
    """The answer that is most often the gold one, and the accuracy of always giving it (ties: first seen)."""
    if not references:
        return "", float("nan")
    counts = Counter(normalise_answer(r) for r in references)
    answer, n = counts.most_common(1)[0]
    return answer, n / len(references)


def distinct_answers(items: list[dict]) -> int:
    """How many different answers a model gave: the judge's extracted answer, else the stripped prediction."""
    return len({normalise_answer(i["extracted"] if i.get("extracted") is not None else i["prediction"].strip())
                for i in items})


def world_summary(summary: dict, items: list[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """`evaluate_rows`' summary with a 95% bootstrap CI on the accuracy and, per question kind, the accuracy,
    the best constant answer's accuracy (what a model answering one word per kind would get) and the number
    of distinct answers given (a model collapsing onto one answer shows 1)."""
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for i in items:
        by_kind[i["kind"]].append(i)
    lo, hi = bootstrap_ci([Unit(i["id"], i["correct"]) for i in items], "micro", n_boot, seed)
    per_kind = {}
    for kind, its in sorted(by_kind.items()):
        answer, const = best_constant([i["reference"] for i in its])
        per_kind[kind] = {"accuracy": sum(i["correct"] for i in its) / len(its), "best_constant": const,
                          "best_constant_answer": answer, "distinct_answers": distinct_answers(its), "n": len(its)}
    return {**summary, "ci": [lo / 100, hi / 100], "per_kind": per_kind}


def verdict(ci: list[float]) -> str:
    return "CI above zero" if ci[0] > 0 else "CI below zero" if ci[1] < 0 else "CI crosses zero"


def paired_differences(pairs: list[tuple[str, str]], world_items: dict[str, list[dict]],
                       eval_dir: Path | None, n_boot: int = 1000, seed: int = 0) -> dict:
    """B - A for each (A, B) pair, in points with 95% paired-bootstrap CIs: on the world test split (paired by
    question id) and on the benchmark average (paired by benchmark item, from eval_dir/MODEL/NAME/units.json)."""
    out = {}
    for a, b in pairs:
        d: dict = {"a": a, "b": b}
        if a in world_items and b in world_items:
            w = paired_bootstrap({i["id"]: i["correct"] for i in world_items[a]},
                                 {i["id"]: i["correct"] for i in world_items[b]}, n_boot, seed)
            d["world_test"] = {**w, "verdict": verdict(w["ci"])}
        if eval_dir is not None:
            avg = compare(read_units(eval_dir / a), read_units(eval_dir / b), n_boot, seed)["average"]
            d["average"] = {**avg, "verdict": verdict(avg["ci"])}
        out[f"{b} - {a}"] = d
    return out


def write_report(report: dict, json_path: Path, md_path: Path, png_path: Path) -> list[Path]:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    md_path.write_text(markdown(report))
    if report["benchmarks"]:
        bar_chart(report, png_path)
    else:
        test_chart(report, png_path)
    return [json_path, md_path, png_path]


def _cell(score: float, ci: list[float]) -> str:
    return f"{score:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def test_label(report: dict) -> str:
    """What the report calls its test split: the world's, or yours named after its files."""
    return report.get("test_split") or "world test split"


def markdown(report: dict) -> str:
    models = report["models"]
    names = list(report["benchmarks"])
    if not names:  # your own test split, with no benchmark file given
        return "\n".join([f"# Evaluation on the {test_label(report)}", "", *side_by_side(report),
                          "No benchmark was scored: evaluate.benchmarks names no file (the mini benchmarks are made "
                          "from the embedded world).", "",
                          f"Candidate for promotion: `{report['candidate']}` (test accuracy "
                          f"{report['score']:.2f}%)."]) + "\n"
    suite = "the 14 mini benchmarks of the embedded world" if report["suite"] == "mini" else "benchmark files"
    lines = [f"# Evaluation on {suite}", "", *side_by_side(report), "## Benchmarks", "",
             (f"Scores in percent with 95% bootstrap CIs ({report['bootstrap']} resamples); scoring protocol "
              f"`{report['protocol']}`. Average = unweighted mean over {len(names)} benchmarks. Chance = the "
              "expected score of guessing a listed option at random (open questions: 0)."), "",
             "| benchmark | items | chance | " + " | ".join(models) + " |", "|---|---|---|" + "---|" * len(models)]
    for b in names:
        first = next(iter(models.values()))["benchmarks"][b]
        lines.append(f"| {b} | {first['items']} | {first.get('chance', float('nan')):.1f} | " + " | ".join(
            _cell(m["benchmarks"][b]["score"], m["benchmarks"][b]["ci"]) for m in models.values()) + " |")
    chance = [next(iter(models.values()))["benchmarks"][b].get("chance", float("nan")) for b in names]
    lines.append(f"| **average** | | {sum(chance) / max(len(chance), 1):.1f} | " + " | ".join(
        f"**{_cell(m['average'], m['average_ci'])}**" for m in models.values()) + " |")
    lines.append("| tokens / answer | | | " + " | ".join(f"{m['mean_tokens']:.1f}" for m in models.values()) + " |")
    lines.append("| latency ms / answer (batch) | | | " + " | ".join(f"{1000 * m['mean_latency_s']:.0f}"
                                                              for m in models.values()) + " |")
    lines.append("| ms / answer (throughput) | | | " + " | ".join(f"{1000 * m['seconds_per_answer']:.1f}"
                                                           for m in models.values()) + " |")
    cand = report["candidate"]
    lines += ["", f"Candidate for promotion: `{cand}` (average {report['score']:.2f})."]

    c = models[cand]["benchmarks"]
    lines += ["", f"## Per category and difficulty (`{cand}`)", "", "| benchmark | group | score | n |",
              "|---|---|---|---|"]
    for b in names:
        for kind in ("per_category", "per_difficulty"):
            for group, v in c[b][kind].items():
                label = group if kind == "per_category" else f"difficulty: {group}"
                lines.append(f"| {b} | {label} | {v['score']:.1f} | {v['n']} |")
    notes = [f"- {b}: {n} item(s): {note}" for b in names for note, n in c[b]["notes"].items()]
    notes += [f"- {b} ({label}): {JudgeTally(**m['benchmarks'][b]['judge']).line()}" for label, m in models.items()
              for b in names if (m["benchmarks"][b].get("judge") or {}).get("unusable")]
    if notes:
        lines += ["", "## Scoring notes", ""] + notes
    return "\n".join(lines) + "\n"


def _diff_cell(d: dict | None, digits: int = 1) -> str:
    if d is None:
        return "| | |"
    return f"{d['diff']:+.{digits}f} | [{d['ci'][0]:+.{digits}f}, {d['ci'][1]:+.{digits}f}] | {d['verdict']}"


def headline(diff: dict, test: str = "world test split") -> str:
    """One sentence: does B beat A, on the test split and on the benchmark average?"""
    a, b = diff["a"], diff["b"]
    parts = []
    for key, label in (("world_test", test), ("average", "benchmark average")):
        if key in diff:
            d = diff[key]
            outcome = {"CI above zero": f"`{b}` beats `{a}`", "CI below zero": f"`{b}` is worse than `{a}`"}.get(
                d["verdict"], "no difference shown")
            parts.append(f"{label} {d['diff']:+.1f} points, 95% CI [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]: "
                         f"{d['verdict']}, {outcome}")
    return f"**{b} - {a}**: " + "; ".join(parts) + "."


def side_by_side(report: dict) -> list[str]:
    """SFT -> RL -> merged (-> baseline) in one table with CIs, then the paired differences; [] for a report
    without world test figures (an `eval run` of one model)."""
    models = report["models"]
    if not models or not all("ci" in m.get("world_test", {}) for m in models.values()):
        return []
    first = next(iter(models.values()))["world_test"]
    names = list(models)
    test = test_label(report)
    benchmarks = all(m.get("average") is not None for m in models.values()) and bool(report.get("benchmarks"))
    lines = [f"## {' -> '.join(names)}", ""]
    diffs = report.get("differences", {})
    if diffs:
        lines += [headline(d, test) for d in diffs.values()] + [""]
    lines += [(f"{test[0].upper() + test[1:]}: {first['items']} questions (accuracy 0-1, chance of guessing a listed "
               f"option {first['chance']:.3f}){'; benchmark average in percent' if benchmarks else ''}; 95% bootstrap "
               "CIs. Per question kind: the accuracy, next to the best constant answer's accuracy (always giving the "
               "answer that is most often right for that kind) and the number of distinct answers the model gives."),
              "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
              f"| **{test.removesuffix(' split')} accuracy** | " + " | ".join(
                  f"**{m['world_test']['accuracy']:.3f}** [{m['world_test']['ci'][0]:.3f}, "
                  f"{m['world_test']['ci'][1]:.3f}]" for m in models.values()) + " |"]
    if benchmarks:
        lines.append("| **benchmark average** | " + " | ".join(f"**{_cell(m['average'], m['average_ci'])}**"
                                                               for m in models.values()) + " |")
    for kind, k in first["per_kind"].items():
        if not isinstance(k, dict) or not kind:  # rows without a kind (or category) get no per-kind line
            continue
        lines.append(f"| {kind}: accuracy (n={k['n']}; best constant {k['best_constant']:.3f}, "
                     f"\"{k['best_constant_answer']}\") | " + " | ".join(
                         f"{m['world_test']['per_kind'][kind]['accuracy']:.3f}" for m in models.values()) + " |")
        lines.append(f"| {kind}: distinct answers | " + " | ".join(
            str(m["world_test"]["per_kind"][kind]["distinct_answers"]) for m in models.values()) + " |")
    if diffs:
        if not benchmarks:
            lines += ["", f"Paired differences B - A in points (percent), 95% paired-bootstrap CIs, {test} paired by "
                          "question.", "", f"| B - A | {test.removesuffix(' split')} | 95% CI | |", "|---|---|---|---|"]
            lines += [f"| {label} | {_diff_cell(d.get('world_test'))} |" for label, d in diffs.items()]
            return lines + [""]
        lines += ["", f"Paired differences B - A in points (percent), 95% paired-bootstrap CIs: {test} paired by "
                      "question, benchmark average by benchmark item (each benchmark resampled on its own; means over items, "
                      "while MMStar's own score is a mean over its categories).", "",
                  f"| B - A | {test.removesuffix(' split')} | 95% CI | | benchmark average | 95% CI | |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {label} | {_diff_cell(d.get('world_test'))} | {_diff_cell(d.get('average'), 2)} |"
                  for label, d in diffs.items()]
    return lines + [""]


def test_chart(report: dict, path: Path) -> Path:
    """Test-split accuracy per model with its 95% CI, for a report without benchmarks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    acc = [100 * m["world_test"]["accuracy"] for m in models.values()]
    err = [[a - 100 * m["world_test"]["ci"][0] for a, m in zip(acc, models.values())],
           [100 * m["world_test"]["ci"][1] - a for a, m in zip(acc, models.values())]]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(models)), 4))
    ax.bar(list(models), acc, yerr=[[max(e, 0) for e in row] for row in err], capsize=3)
    ax.set_ylabel(f"{test_label(report)} accuracy (%) with 95% CI")
    ax.set_ylim(0, 100)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def bar_chart(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    models = report["models"]
    names = list(report["benchmarks"]) + ["average"]
    x = np.arange(len(names))
    width = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(names)), 4))
    for i, (model, m) in enumerate(models.items()):
        scores = [m["benchmarks"][b]["score"] for b in names[:-1]] + [m["average"]]
        cis = [m["benchmarks"][b]["ci"] for b in names[:-1]] + [m["average_ci"]]
        err = np.array([[s - lo for s, (lo, _) in zip(scores, cis)], [hi - s for s, (_, hi) in zip(scores, cis)]])
        ax.bar(x + (i - (len(models) - 1) / 2) * width, scores, width, yerr=np.clip(err, 0, None), capsize=2,
               label=model)
    ax.set_xticks(x, names, rotation=45, ha="right")
    ax.set_ylabel("score (%) with 95% CI")
    ax.set_ylim(0, 100)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
