"""A study's training curves: per variant and step, the mean over its finished seeds of the figures the
preconditions read (thought collapse, the held-out policy vs merged-teacher success, RIL's reward signal),
and one picture per group of them next to the report (`<report>.<figure>.png`, drawn headless)."""
from __future__ import annotations

from pathlib import Path

from protege.study.spec import Study

# figure -> (title, panels: each a list of metrics drawn in one axes; the first solid, the next dashed)
FIGURES = {
    "collapse": ("Thought collapse in the training rollouts (mean over seeds)",
                 [["thought_entropy"], ["distinct_thoughts_per_state"], ["thought_self_bleu"], ["thought_tokens"]]),
    "teacher": ("Held-out success, greedy: policy (solid) vs merged teacher (dashed), mean over seeds",
                [["eval_success", "teacher_eval_success"]]),
    "signal": ("RIL's reward signal in training (mean over seeds)",
               [["similarity_reward_student"], ["disc_accuracy"], ["disc_auroc"]]),
}
PANEL_LABELS = {"thought_entropy": "thought entropy (nats/token)",
                "distinct_thoughts_per_state": "distinct thoughts per state",
                "thought_self_bleu": "self-BLEU within an episode", "thought_tokens": "thought length (tokens)",
                "eval_success": "held-out success", "similarity_reward_student": "similarity reward (student)",
                "disc_accuracy": "discriminator accuracy",
                "disc_auroc": "discriminator AUROC (the step's answers)"}
METRICS = tuple(dict.fromkeys(m for _, panels in FIGURES.values() for panel in panels for m in panel))


def mean_curves(study: Study, results: dict[str, dict]) -> dict[str, dict[str, list[list[float]]]]:
    """variant -> metric -> [[step, mean over the seeds that logged it there, seeds], ...] (trained variants with
    a curve only)."""
    from protege.study.preconditions import curve

    out: dict[str, dict[str, list[list[float]]]] = {}
    for name, v in study.variants.items():
        runs = [r for s in study.seeds if (r := results.get(f"{name}/seed-{s}")) is not None] if v.train else []
        for metric in METRICS:
            by_step: dict[int, list[float]] = {}
            for r in runs:
                for step, value in curve(r, metric):
                    by_step.setdefault(step, []).append(value)
            if by_step:
                out.setdefault(name, {})[metric] = [[s, sum(vs) / len(vs), len(vs)] for s, vs in sorted(by_step.items())]
    return out


def figures_with_data(curves: dict) -> list[str]:
    return [key for key, (_, panels) in FIGURES.items()
            if any(m in c for c in curves.values() for panel in panels for m in panel)]


def figure_path(report_md: Path, key: str) -> Path:
    """reports/study/<name>.md -> reports/study/<name>.<key>.png."""
    return report_md.with_name(f"{report_md.stem}.{key}.png")


def draw(curves: dict, key: str, path: Path, title: str = "") -> Path:
    """One figure of FIGURES from mean_curves' output: a panel per metric group, a colour per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    heading, panels = FIGURES[key]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8.0, 4.2 * len(panels) + 1), 3.8), squeeze=False)
    colours = {name: f"C{i}" for i, name in enumerate(curves)}
    for ax, panel in zip(axes[0], panels):
        for name, by_metric in curves.items():
            for metric, style in zip(panel, ("-", "--", ":")):
                points = by_metric.get(metric)
                if not points:
                    continue
                label = name if len(panel) == 1 else f"{name} {'teacher' if metric.startswith('teacher') else 'policy'}"
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=colours[name], marker="o",
                        markersize=3, label=label)
        ax.set_title(PANEL_LABELS.get(panel[0], panel[0]))
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.suptitle(f"{title}: {heading}" if title else heading, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
