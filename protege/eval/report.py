"""The evaluation report: markdown tables and a bar chart from the report dict the evaluate stage writes.

report = {"suite", "protocol", "bootstrap", "benchmarks": {name: file}, "candidate", "score",
          "models": {model: {"average", "average_ci", "benchmarks": {name: summary}, "mean_tokens",
                             "mean_latency_s", "seconds_per_answer", "world_test"?: {...}}}}
"""
from __future__ import annotations

import json
from pathlib import Path


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
    """A model's headline figures for MLflow."""
    return {f"{prefix}average": summary["average"], f"{prefix}mean_tokens": summary["mean_tokens"],
            f"{prefix}mean_latency_s": summary["mean_latency_s"],
            **{f"{prefix}{b}.score": s["score"] for b, s in summary["benchmarks"].items()}}


def write_report(report: dict, json_path: Path, md_path: Path, png_path: Path) -> list[Path]:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    md_path.write_text(markdown(report))
    bar_chart(report, png_path)
    return [json_path, md_path, png_path]


def _cell(score: float, ci: list[float]) -> str:
    return f"{score:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]"


def markdown(report: dict) -> str:
    models = report["models"]
    names = list(report["benchmarks"])
    suite = "the 14 mini benchmarks of the embedded world" if report["suite"] == "mini" else "benchmark files"
    lines = [f"# Evaluation on {suite}", "",
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
    notes = [(b, note, n) for b in names for note, n in c[b]["notes"].items()]
    if notes:
        lines += ["", "## Scoring notes", ""] + [f"- {b}: {n} item(s): {note}" for b, note, n in notes]
    if all("world_test" in m for m in models.values()):
        w = next(iter(models.values()))["world_test"]
        lines += ["", f"## World test split ({w['items']} questions, chance {w['chance']:.3f})", "",
                  "| model | accuracy |", "|---|---|"]
        lines += [f"| {name} | {m['world_test']['accuracy']:.3f} |" for name, m in models.items()]
    return "\n".join(lines) + "\n"


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
