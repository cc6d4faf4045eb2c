"""The benchmark suite of a run: where its files are, answering and scoring them for one model, and the
model's summary (per-benchmark scores with CIs, the 14-benchmark average, tokens and latency)."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from protege.config import EvaluateConfig, JudgeSpec, TeacherSpec
from protege.errors import UserFacingError
from protege.bench.items import BENCHMARKS, BenchItem
from protege.eval.readers import read_benchmark
from protege.eval.judging import JudgeCompleter, JudgeTally
from protege.eval.runner import generate_predictions
from protege.eval.score import score_benchmark, write_predictions, write_scores
from protege.eval.scorers import Completer, suite_protocol
from protege.eval.stats import average_ci
from protege.paths import MINI_BENCHMARKS
from protege.teachers.backends import Outcome, TeacherAnswer, TeacherRequest
from protege.world.benchmarks import FORMATS, SUFFIX


def mini_file(name: str) -> Path:
    """Each in its own folder: MM-Vet's JSON keeps its images in an images/ folder beside it."""
    return MINI_BENCHMARKS / name / f"{name}{SUFFIX[FORMATS[name]]}"


def benchmark_files(cfg: EvaluateConfig, root: Path) -> dict[str, Path]:
    """Benchmark name -> file, in the paper's order."""
    if cfg.benchmarks == "mini":
        return {name: root / mini_file(name) for name in BENCHMARKS}
    chosen = {name: Path(p) if Path(p).is_absolute() else root / p for name, p in cfg.benchmarks.items()}
    return {name: chosen[name] for name in BENCHMARKS if name in chosen}


def load_suite(files: dict[str, Path], only: list[str] | None = None, mini: bool = False
               ) -> dict[str, list[BenchItem]]:
    if only:
        unknown = sorted(set(only) - set(files))
        if unknown:
            raise UserFacingError(f"benchmark(s) {unknown} are not in this suite; available: {', '.join(files)}")
    suite = {}
    for name, path in files.items():
        if only and name not in only:
            continue
        if mini and not path.exists():
            raise UserFacingError(f"{path}: the mini benchmarks are not written yet; run `dvc repro "
                                  "mini_benchmarks` (or `protege stage mini_benchmarks`) in the project folder")
        suite[name] = scored_split(read_benchmark(name, path))
    return suite


def scored_split(items: list[BenchItem]) -> list[BenchItem]:
    """MMMU's VLMEvalKit file (MMMU_DEV_VAL) holds the few-shot dev split and the validation split; the
    harnesses report validation only, so dev rows are left out when both are present."""
    splits = {it.meta.get("split") for it in items}
    if items and items[0].benchmark in ("mmmu", "mmmu_pro") and {"dev", "validation"} <= splits:
        return [it for it in items if it.meta.get("split") != "dev"]
    return items


def grader_prompt(cfg: EvaluateConfig, root: Path) -> str | None:
    if cfg.mmvet_grader_prompt is None:
        return None
    path = Path(cfg.mmvet_grader_prompt)
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise UserFacingError(f"evaluate.mmvet_grader_prompt: {path} not found (a text file holding the few-shot "
                              "grading table of MM-Vet's grader, ending before the row to grade)")
    return path.read_text(encoding="utf-8")


def completer_for(spec: TeacherSpec | None, root: Path, seed: int) -> JudgeCompleter | None:
    """A text LLM as a judge / answer extractor, from a teacher spec; None keeps scoring rule-based."""
    if spec is None:
        return None
    from protege.teachers.factory import build_teacher

    # a grade or an extraction must not depend on the draw: the judge decodes greedily
    backend = build_teacher(spec.model_copy(update={"temperature": 0.0}), root, error_rate=0.0, seed=seed)

    def ask_all(prompts: list[str]) -> tuple[dict[int, str], dict[int, tuple[str, str]]]:
        replies, failures = {}, {}

        def collect(outcome: Outcome) -> None:
            if isinstance(outcome, TeacherAnswer) and outcome.text.strip():
                replies[int(outcome.key)] = outcome.text
            elif isinstance(outcome, TeacherAnswer):
                failures[int(outcome.key)] = ("empty", "empty reply")
            else:
                failures[int(outcome.key)] = (outcome.kind, outcome.error)

        backend.run([TeacherRequest(str(i), str(i), p) for i, p in enumerate(prompts)], collect)
        return replies, failures

    where = f" at {spec.base_url}" if spec.base_url else ""
    judge = spec if isinstance(spec, JudgeSpec) else JudgeSpec(**spec.model_dump())
    return JudgeCompleter(ask_all, f"evaluate.judge {spec.name!r} ({spec.backend}, model {spec.model!r}{where})",
                          judge.max_unusable)


def evaluate_model(model, processor, suite: dict[str, list[BenchItem]], cfg: EvaluateConfig, out_dir: Path,
                   complete: Completer | None = None, seed: int = 0, log=print, grader: str | None = None,
                   progress=None) -> dict:
    """Answers and scores every benchmark of the suite; writes predictions, scored items and units per
    benchmark under out_dir/NAME/ (emptied first: results of an earlier run must not mix in) and returns
    the model's summary. `progress(done, total)`: items answered so far over the whole suite."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    results, units_by_bench = {}, {}
    tokens = latency = answers = wall = 0.0
    total = sum(map(len, suite.values()))
    for name, items in suite.items():
        t0 = time.perf_counter()
        before = int(answers)
        preds = generate_predictions(model, processor, items, cfg.batch_size, cfg.max_new_tokens,
                                     progress=None if progress is None else
                                     (lambda done, _, b=before: progress(b + done, total)))
        wall += time.perf_counter() - t0
        write_predictions(out_dir / name / "predictions.jsonl", preds)
        summary, rows, units = score_benchmark(name, items, {p.index: p for p in preds},
                                               suite_protocol(name, cfg.protocol), complete, cfg.bootstrap, seed,
                                               grader)
        write_scores(out_dir / name, summary, rows, units)
        results[name] = summary
        units_by_bench[name] = (units, summary["aggregate"])
        tokens += sum(p.tokens for p in preds)
        latency += sum(p.latency_s for p in preds)
        answers += len(preds)
        lo, hi = summary["ci"]
        judged = f"; {JudgeTally(**summary['judge']).line()}" if (summary["judge"] or {}).get("unusable") else ""
        log(f"{name}: {summary['score']:.1f} [{lo:.1f}, {hi:.1f}] on {summary['items']} items{judged}")
    if not suite:  # no benchmark file given: the caller scores its test split only
        return {"average": None, "average_ci": None, "benchmarks": {}, "mean_tokens": None, "mean_latency_s": None,
                "seconds_per_answer": None, "answers": 0}
    avg, lo, hi = average_ci(units_by_bench, cfg.bootstrap, seed)
    return {"average": avg, "average_ci": [lo, hi], "benchmarks": results,
            "mean_tokens": tokens / max(answers, 1), "mean_latency_s": latency / max(answers, 1),
            "seconds_per_answer": wall / max(answers, 1), "answers": int(answers)}
