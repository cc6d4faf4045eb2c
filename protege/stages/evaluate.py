"""evaluate: the 14 benchmarks (mini or real files) for the SFT, final RL and merged models, plus the
world's test split; report with bootstrap CIs (markdown, JSON, bar chart), logged to MLflow."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from protege.config import Config
from protege.data.rows import load_rows
from protege.eval.accuracy import evaluate_rows
from protege.eval.report import model_metrics, new_report, write_report
from protege.eval.suite import (
    benchmark_files,
    completer_for,
    evaluate_model,
    grader_prompt,
    load_suite,
)
from protege.models.student import load_student
from protege.paths import (
    EVAL_DIR,
    EVAL_ITEMS,
    EVAL_JSON,
    EVAL_MD,
    EVAL_PNG,
    MERGED_MODEL,
    RL_CHECKPOINTS,
    SFT_MODEL,
    SPLIT_TABLES,
)
from protege.stages.common import say

CANDIDATE = "merged"  # the pipeline's output, the one `promote` considers


def models_to_evaluate(root: Path) -> dict[str, Path]:
    last_rl = max((root / RL_CHECKPOINTS).glob("step-*"))
    return {"sft": SFT_MODEL, "rl_final": last_rl.relative_to(root), CANDIDATE: MERGED_MODEL}


def run(cfg: Config, root: Path, run) -> None:
    ev = cfg.evaluate
    run.log_params(ev.model_dump(exclude={"judge"}), "evaluate.")
    files = benchmark_files(ev, root)
    suite = load_suite(files, mini=ev.benchmarks == "mini")  # reads and checks every file before any model runs
    for name, path in files.items():
        run.log_input(path, context=f"benchmark:{name}")
    grader = grader_prompt(ev, root)
    say("evaluate", f"{len(suite)} benchmarks, {sum(map(len, suite.values()))} items; judge: "
                    f"{ev.judge.name if ev.judge else 'rules only'}")
    complete = completer_for(ev.judge, root, cfg.seed)
    if (root / EVAL_DIR).exists():
        shutil.rmtree(root / EVAL_DIR)  # a model or benchmark dropped since the last run must not linger
    test_rows = load_rows(root / SPLIT_TABLES["test"])
    report = new_report(ev, files, CANDIDATE)
    world_items = []
    for model_name, rel in models_to_evaluate(root).items():
        run.log_input(rel, context=f"model:{model_name}")
        model, processor = load_student(root / rel)
        summary = evaluate_model(model, processor, suite, ev, root / EVAL_DIR / model_name, complete, cfg.seed,
                                 log=lambda m, n=model_name: say("evaluate", f"{n} {m}"), grader=grader)
        world, items = evaluate_rows(model, processor, test_rows, ev.batch_size, ev.max_new_tokens)
        world_items += [{"model": model_name, **i} for i in items]
        report["models"][model_name] = {"path": str(rel), **summary, "world_test": world}
        run.log_metrics({**model_metrics(summary, f"{model_name}."),
                         f"{model_name}.world_test.accuracy": world["accuracy"]})
        lo, hi = summary["average_ci"]
        say("evaluate", f"{model_name}: average {summary['average']:.1f} [{lo:.1f}, {hi:.1f}] over "
                        f"{len(suite)} benchmarks; world test accuracy {world['accuracy']:.3f}")
    report["score"] = report["models"][CANDIDATE]["average"]
    written = write_report(report, root / EVAL_JSON, root / EVAL_MD, root / EVAL_PNG)
    (root / EVAL_ITEMS).write_text("".join(json.dumps(i) + "\n" for i in world_items))
    for p in [*written, root / EVAL_ITEMS]:
        run.log_artifact(p)
    run.log_artifact(root / EVAL_DIR, "eval")
