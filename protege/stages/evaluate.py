"""evaluate: the 14 benchmarks (mini or real files) for the SFT, final RL and merged models (and the final
checkpoint of the rl_baseline stage, when it ran), plus the world's test split; report with bootstrap CIs,
per question kind figures and the paired differences SFT -> RL -> merged (markdown, JSON, bar chart),
logged to MLflow."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from protege.config import Config
from protege.data.loader import workers_of_rank
from protege.data.rows import load_rows
from protege.eval.accuracy import evaluate_rows
from protege.eval.report import (
    headline,
    model_metrics,
    new_report,
    paired_differences,
    world_summary,
    write_report,
)
from protege.eval.suite import (
    benchmark_files,
    completer_for,
    evaluate_model,
    grader_prompt,
    load_suite,
)

from protege.paths import (
    EVAL_DIR,
    EVAL_ITEMS,
    EVAL_JSON,
    EVAL_MD,
    EVAL_PNG,
    MERGED_MODEL,
    RL_CHECKPOINTS,
    SFT_MODEL,
    split_table,
    checkpoints,
)
from protege.stages.common import progress, say
from protege.stages.student_model import load_model
from protege.stages.rl_baseline import RL_BASELINE, baseline_algorithm

CANDIDATE = "merged"  # the pipeline's output, the one `promote` considers


def models_to_evaluate(root: Path) -> dict[str, Path]:
    """sft, rl_final, merged, and `<algorithm>_final` for the rl_baseline stage's last checkpoint if it ran."""
    last_rl = checkpoints(root / RL_CHECKPOINTS)[-1]
    models = {"sft": SFT_MODEL, "rl_final": last_rl.relative_to(root), CANDIDATE: MERGED_MODEL}
    algorithm = baseline_algorithm(root)
    if algorithm is not None:
        models[f"{algorithm}_final"] = checkpoints(root / RL_BASELINE)[-1].relative_to(root)
    return models


def pairs_to_compare(models: list[str]) -> list[tuple[str, str]]:
    """(A, B) for B - A: rl_final - sft, merged - sft, and rl_final - the baseline."""
    pairs = [("sft", "rl_final"), ("sft", CANDIDATE)]
    return pairs + [(m, "rl_final") for m in models if m not in ("sft", "rl_final", CANDIDATE)]


def test_split_label(cfg: Config) -> str:
    """The world's test split, or yours named after its files."""
    if cfg.data.source == "world":
        return "world test split"
    test = cfg.data.test
    names = [Path(e).name for e in ([test] if isinstance(test, str) else test)]
    return f"test split ({', '.join(names)})"


def engine_extent(ev, processor, suite: dict, test_rows: list, model) -> tuple[int, int | None]:
    """(max_model_len, images per prompt) of a vLLM engine answering the suite and the test rows: the setting, or
    the longest prompt measured through the model's processor, plus max_new_tokens."""
    from protege.eval.runner import prompt_extent

    from protege.generation.vllm_backend import image_limit

    items = [it for bench in suite.values() for it in bench]
    images = image_limit(model, [list(it.images) for it in items] + [r.image_count for r in test_rows])
    if ev.vllm_max_model_len:
        return ev.vllm_max_model_len, images
    say("evaluate", f"measuring {len(items) + len(test_rows)} prompts for the vLLM engine's context")
    longest, _ = prompt_extent(processor, items, [r.question for r in test_rows], [r.source for r in test_rows])
    return longest + ev.max_new_tokens, images


def run(cfg: Config, root: Path, run) -> None:
    ev = cfg.evaluate
    run.log_params(ev.model_dump(exclude={"judge"}), "evaluate.")
    test_label = test_split_label(cfg)
    if cfg.data.source != "world" and ev.benchmarks == "mini":
        files = {}  # the mini benchmarks are made from the embedded world
        say("evaluate", "no benchmark: evaluate.benchmarks is mini, and the mini benchmarks come from the embedded "
                        f"world; scoring the {test_label} only (point evaluate.benchmarks at benchmark files to add them)")
    else:
        files = benchmark_files(ev, root)
    suite = load_suite(files, mini=ev.benchmarks == "mini")  # reads and checks every file before any model runs
    for name, path in files.items():
        run.log_input(path, context=f"benchmark:{name}")
    grader = grader_prompt(ev, root)
    if suite:
        say("evaluate", f"{len(suite)} benchmarks, {sum(map(len, suite.values()))} items; judge: "
                        f"{ev.judge.name if ev.judge else 'rules only'}")
    complete = completer_for(ev.judge, root, cfg.seed)
    if (root / EVAL_DIR).exists():
        shutil.rmtree(root / EVAL_DIR)  # a model or benchmark dropped since the last run must not linger
    test_rows = load_rows(root / split_table(cfg.data.source, "test"))
    report = new_report(ev, files, CANDIDATE)
    report["test_split"] = test_label
    if not suite:  # promote then compares test accuracies, on this test split only
        report["suite"] = f"test:{test_label}"
    world_items, items_by_model = [], {}
    models = models_to_evaluate(root)
    extent = None  # a vLLM engine's context and images per prompt, measured once
    for model_name, rel in models.items():
        run.log_input(rel, context=f"model:{model_name}")
        model, processor = load_model(cfg, root / rel)
        if ev.generation == "vllm":  # an engine answers in the model's place, its weights synced from the model
            from protege.generation.vllm_backend import generator_from_model

            extent = extent or engine_extent(ev, processor, suite, test_rows, model)  # every model: one family
            length, images = extent
            model = generator_from_model(model, processor, seed=cfg.seed, max_model_len=length,
                                         images_per_prompt=images)
        answered = progress("evaluate", run, f"{model_name}.benchmark_items", sum(map(len, suite.values())))
        summary = evaluate_model(model, processor, suite, ev, root / EVAL_DIR / model_name, complete, cfg.seed,
                                 log=lambda m, n=model_name: say("evaluate", f"{n} {m}"), grader=grader,
                                 progress=answered.reached)
        answered = progress("evaluate", run, f"{model_name}.test_questions", len(test_rows))
        world, items = evaluate_rows(model, processor, test_rows, ev.batch_size, ev.max_new_tokens,
                                     progress=answered.reached, workers=workers_of_rank(cfg.data.workers))
        if ev.generation == "vllm":
            model.close()  # its device memory goes back before the next model's engine starts
        world = world_summary(world, items, ev.bootstrap, cfg.seed)
        items_by_model[model_name] = items
        world_items += [{"model": model_name, **i} for i in items]
        report["models"][model_name] = {"path": str(rel), **summary, "world_test": world}
        run.log_metrics({**model_metrics(summary, f"{model_name}."),
                         f"{model_name}.world_test.accuracy": world["accuracy"]})
        wlo, whi = world["ci"]
        bench = ""
        if suite:
            lo, hi = summary["average_ci"]
            bench = f"average {summary['average']:.1f} [{lo:.1f}, {hi:.1f}] over {len(suite)} benchmarks; "
        say("evaluate", f"{model_name}: {bench}{test_label.removesuffix(' split')} accuracy {world['accuracy']:.3f} "
                        f"[{wlo:.3f}, {whi:.3f}]")
    candidate = report["models"][CANDIDATE]
    report["score"] = candidate["average"] if suite else 100 * candidate["world_test"]["accuracy"]
    report["differences"] = paired_differences(pairs_to_compare(list(models)), items_by_model,
                                               root / EVAL_DIR if suite else None, ev.bootstrap, cfg.seed)
    for label, d in report["differences"].items():
        key = label.replace(" ", "")
        run.log_metrics({f"diff.{key}.world_test": d["world_test"]["diff"],
                         **({f"diff.{key}.average": d["average"]["diff"]} if "average" in d else {})})
        say("evaluate", headline(d, test_label))
    (root / EVAL_DIR).mkdir(parents=True, exist_ok=True)  # a DVC output even when no benchmark filled it
    written = write_report(report, root / EVAL_JSON, root / EVAL_MD, root / EVAL_PNG)
    (root / EVAL_ITEMS).write_text("".join(json.dumps(i) + "\n" for i in world_items))
    for p in [*written, root / EVAL_ITEMS]:
        run.log_artifact(p)
    run.log_artifact(root / EVAL_DIR, "eval")
