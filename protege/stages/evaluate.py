"""evaluate: accuracy on the held-out test split for SFT, final RL and merged models; report."""
from __future__ import annotations

import json
from pathlib import Path

from protege.config import Config
from protege.data.rows import load_rows
from protege.eval.accuracy import evaluate_rows
from protege.models.student import load_student
from protege.paths import EVAL_ITEMS, EVAL_JSON, EVAL_MD, MERGED_MODEL, RL_CHECKPOINTS, SFT_MODEL, SPLIT_TABLES
from protege.stages.common import say

CANDIDATE = "merged"  # the pipeline's output, the one `promote` considers


def models_to_evaluate(root: Path) -> dict[str, Path]:
    last_rl = sorted((root / RL_CHECKPOINTS).glob("step-*"))[-1]
    return {"sft": SFT_MODEL, "rl_final": last_rl.relative_to(root), CANDIDATE: MERGED_MODEL}


def markdown(report: dict) -> str:
    models = report["models"]
    kinds = sorted(next(iter(models.values()))["per_kind"])
    lines = [f"# Evaluation on the test split ({report['items']} questions, chance {report['chance']:.3f})", "",
             "| model | accuracy | " + " | ".join(kinds) + " | tokens/answer | ms/answer |",
             "|---|---|" + "---|" * len(kinds) + "---|---|"]
    for name, m in models.items():
        lines.append(f"| {name} | {m['accuracy']:.3f} | " + " | ".join(f"{m['per_kind'][k]:.3f}" for k in kinds)
                     + f" | {m['mean_tokens']:.1f} | {1000 * m['seconds_per_answer']:.1f} |")
    lines += ["", f"Candidate for promotion: `{report['candidate']}` (accuracy {report['score']:.3f})."]
    return "\n".join(lines) + "\n"


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.evaluate.model_dump(), "evaluate.")
    run.log_input(SPLIT_TABLES["test"], context="test")
    rows = load_rows(root / SPLIT_TABLES["test"])
    report = {"items": len(rows), "models": {}, "candidate": CANDIDATE}
    items_out = []
    for name, rel in models_to_evaluate(root).items():
        run.log_input(rel, context=f"model:{name}")
        model, processor = load_student(root / rel)
        summary, items = evaluate_rows(model, processor, rows, cfg.evaluate.batch_size, cfg.evaluate.max_new_tokens)
        report["models"][name] = {"path": str(rel), **summary}
        report["chance"] = summary["chance"]
        items_out += [{"model": name, **i} for i in items]
        run.log_metrics({f"{name}.accuracy": summary["accuracy"], f"{name}.mean_tokens": summary["mean_tokens"],
                         **{f"{name}.{k}.accuracy": v for k, v in summary["per_kind"].items()}})
        say("evaluate", f"{name}: accuracy {summary['accuracy']:.3f} (chance {summary['chance']:.3f})")
    report["score"] = report["models"][CANDIDATE]["accuracy"]
    (root / EVAL_JSON).parent.mkdir(parents=True, exist_ok=True)
    (root / EVAL_JSON).write_text(json.dumps(report, indent=2))
    (root / EVAL_MD).write_text(markdown(report))
    (root / EVAL_ITEMS).write_text("".join(json.dumps(i) + "\n" for i in items_out))
    for p in (EVAL_JSON, EVAL_MD, EVAL_ITEMS):
        run.log_artifact(root / p)
