"""Running a study: one folder per (variant, seed) run that trains from the project's shared upstream
artifacts, evaluates, and writes its per-item results atomically.

    reports/study/<name>/runs/<variant>/seed-<k>/
        data -> <project>/data                 shared inputs, as symlinks: the stage recipes run unchanged
        models/sft -> <project>/models/sft     with this folder as their root
        models/discriminator -> ...            (models/agent_sft, models/tool_sft: the games' warm starts)
        models/rl/, models/merged/             written by the rl and merge stages (deleted when finished,
                                               unless keep_checkpoints); models/agent_rl/, models/tool_rl/
                                               by a game study's runs
        eval/<model>/                          predictions and scores per benchmark, world test answers
        reports/<rl|agent|tool>/train_curve.csv  every training step's figures (copied into result.json's `curve`)
        result.json                            per-item results, the training curve, the upstream figures a
                                               precondition reads; written last, atomically: the run is finished
        fingerprint, mlflow_run_id, log.txt

A run is finished when its result.json holds the fingerprint of its resolved params and of the upstream
artifacts; anything else is (re)started, and the rl stage resumes from its own state where it can.
Nothing here imports Prefect: `flows/study.py` wires these functions into a flow, and `run_study` runs
them without one.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from protege import tracking
from protege.config import ConfigError, load_config
from protege.errors import UserFacingError
from protege.paths import (
    AGENT_RL,
    BASE_MODEL,
    AGENT_SFT_MODEL,
    CURATED,
    CURATED_RL,
    DISCRIMINATOR,
    IMPORTED,
    MERGED_MODEL,
    MINI_BENCHMARKS,
    RL_CHECKPOINTS,
    SFT_MODEL,
    STAGE_METRICS,
    TEACHER_ANSWERS,
    TOOL_RL,
    TOOL_SFT_MODEL,
    WORLD,
    checkpoints,
    split_table,
)
from protege.stages.games import GAMES
from protege.study import estimate, warm_starts
from protege.study.outcomes import model_result
from protege.study.spec import GAME_TASKS, RunSpec, Study, Suite, load_study

RESULT = "result.json"
FINGERPRINT = "fingerprint"
MLFLOW_RUN = "mlflow_run_id"
LOG = "log.txt"
STATE = "study.json"                      # reports/study/<name>/study.json: the parent run id
# linked into every run folder
DATA, DVC_LOCK = Path("data"), Path("dvc.lock")
SHARED = (DATA, SFT_MODEL, DISCRIMINATOR, AGENT_SFT_MODEL, TOOL_SFT_MODEL, DVC_LOCK)
UPSTREAM = (WORLD, IMPORTED, MINI_BENCHMARKS, CURATED, TEACHER_ANSWERS, SFT_MODEL, DISCRIMINATOR, AGENT_SFT_MODEL,
            TOOL_SFT_MODEL)  # fingerprinted
# upstream that feeds one task's studies only: rebuilding it leaves the other studies' finished runs finished
# (models/agent_sft was fingerprinted by every study before and stays so)
TASK_UPSTREAM = {TOOL_SFT_MODEL: "tool"}


class RunFailed(UserFacingError):
    pass


def say(message: str) -> None:
    from protege.stages.common import say as stage_say

    stage_say("study", message)


# ---------------------------------------------------------------------------------------------- planning


def required_upstream(runs: list[RunSpec], task: str = "qa", project_seed: int | None = None,
                      own_game: bool = False) -> list[Path]:
    """What the runs read from the project. A qa run on the study's own warm start (a warm-start seed other
    than params.yaml's `seed`) reads the project's questions and base student, not its SFT, curated set,
    teacher answers or discriminator: its warm start makes those. A game study with a game of its own
    (`own_game`: every warm start is the study's) needs no project warm start, only the base student."""
    if task in GAME_TASKS:
        if not own_game:
            return [GAMES[task].sft_model]
        return [BASE_MODEL] if runs and runs[0].config.model.path is None else []
    source = runs[0].config.data.source if runs else "world"
    shared = [r for r in runs if r.warm_seed is None or r.warm_seed == project_seed]
    own = [r for r in runs if r not in shared]
    need = [split_table(source, "test")]
    if shared or not runs:
        need.append(SFT_MODEL)
    if any(r.train for r in shared):
        need.append(CURATED_RL)
    if any(r.train and r.config.rl.algorithm == "ril" for r in shared):
        need += [TEACHER_ANSWERS, DISCRIMINATOR]
    if own:
        need += [split_table(source, "train"), split_table(source, "rl")]
        if own[0].config.model.path is None:
            need.append(BASE_MODEL)
    if any(r.config.evaluate.benchmarks == "mini" for r in runs):
        need.append(MINI_BENCHMARKS)
    return need


def check_upstream(study: Study, runs: list[RunSpec] | None = None) -> None:
    """The shared artifacts the runs train and evaluate from must exist: a study never computes them (its own
    warm starts aside)."""
    runs = runs if runs is not None else study.runs()
    project_seed = None
    if study.task == "qa" and any(r.warm_seed is not None for r in runs):
        try:
            project_seed = load_config(study.project / "params.yaml").seed
        except (ConfigError, OSError):
            project_seed = None
    own_game = study.task in GAME_TASKS and not warm_starts.plays_projects_game(study)
    missing = [str(p) for p in required_upstream(runs, study.task, project_seed, own_game)
               if not (study.project / p).exists()]
    if missing and own_game:
        raise UserFacingError(f"{study.path}: the study trains its warm starts from the project's base student, and "
                              f"{', '.join(missing)} is missing in {study.project}: run `dvc repro world` there first")
    if missing and study.task in GAME_TASKS:
        article = "an" if study.task[0] in "aeiou" else "a"
        raise UserFacingError(f"{study.path}: {article} {study.task} study trains from the project's warm start, and "
                              f"{', '.join(missing)} is missing in {study.project}: run "
                              f"`dvc repro {GAMES[study.task].sft_stage}` there first")
    if missing:
        raise UserFacingError(f"{study.path}: the study trains from the project's shared upstream artifacts, and "
                              f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing in {study.project}: "
                              "run `make demo` (or `dvc repro disc_pretrain mini_benchmarks`) there first")


def upstream_digest(project: Path, task: str = "qa", skip: tuple[Path, ...] = ()) -> str:
    # your imported data counts where there is some: a world project's fingerprints stay what they were
    parts = {str(rel): tracking.input_digest(project, rel) for rel in UPSTREAM
             if TASK_UPSTREAM.get(rel, task) == task and (rel != IMPORTED or (project / rel).exists())
             and rel not in skip}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def run_fingerprint(run: RunSpec, upstream: str) -> str:
    params = run.config.model_dump()
    # what never changes a run's result: placement, threads, batching of generation, promotion
    for key in ("offload_idle", "device"):
        params["rl"].pop(key, None)
    for key in ("threads", "promote"):
        params.pop(key, None)
    params["evaluate"].pop("batch_size", None)
    return hashlib.sha256(json.dumps([params, run.train, upstream], sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


@dataclass
class Planned:
    run: RunSpec
    folder: Path
    fingerprint: str
    finished: bool


def read_result(folder: Path) -> dict | None:
    try:
        return json.loads((folder / RESULT).read_text())
    except (OSError, ValueError):
        return None


def plan(study: Study) -> list[Planned]:
    """Every run of the study with its folder and whether it has finished with these params and inputs."""
    # a game study with a game of its own never reads the project's warm start (another game's): a rebuilt one
    # leaves its runs finished
    own_game = study.task in GAME_TASKS and not warm_starts.plays_projects_game(study)
    upstream = upstream_digest(study.project, study.task, (GAMES[study.task].sft_model,) if own_game else ())
    warm = {w: warm_starts.fingerprint(study, w) for w in study.warm_start_seeds}
    out = []
    for run in study.runs():
        folder = study.run_folder(run)
        # a run on the study's own warm start depends on it as it does on the shared upstream
        fp = run_fingerprint(run, upstream if run.warm_seed is None else f"{upstream}|warm-{run.warm_seed}:"
                                                                         f"{warm[run.warm_seed]}")
        result = read_result(folder)
        out.append(Planned(run, folder, fp, result is not None and result.get("fingerprint") == fp))
    return out


# ---------------------------------------------------------------------------------------------- one run


def _link(src: Path, dst: Path) -> None:
    if dst.is_symlink() and dst.resolve() == src.resolve():
        return
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.is_dir():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(src, dst.parent), dst)


def prepare_folder(study: Study, planned: Planned) -> None:
    """The run folder with links to the shared inputs; emptied first if it holds another fingerprint's work."""
    folder = planned.folder
    old = (folder / FINGERPRINT).read_text().strip() if (folder / FINGERPRINT).exists() else None
    if old is not None and old != planned.fingerprint:
        previous = (folder / MLFLOW_RUN).read_text().strip() if (folder / MLFLOW_RUN).exists() else None
        tracking.retire_run(study.project, previous, "its params or upstream artifacts changed; run again")
        for entry in folder.iterdir():  # the log stays: the process that started this one may be writing it
            if entry.name == LOG:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FINGERPRINT).write_text(planned.fingerprint + "\n")
    warm = planned.run.warm_seed
    own = study.task == "qa" and warm is not None and not warm_starts.is_projects(study, warm)
    for rel in SHARED:
        if own and rel in (DATA, DVC_LOCK):
            continue  # a qa run on the study's own warm start: data/ and dvc.lock of its own, below
        if (study.project / rel).exists():
            _link(study.project / rel, folder / rel)
    if own:
        link_qa_warm_start(study, warm, folder)
    elif warm is not None and study.task in GAME_TASKS:  # the study's own warm start this seed plays from
        _link(warm_starts.model_dir(study, warm), folder / GAMES[study.task].sft_model)


def link_qa_warm_start(study: Study, seed: int, folder: Path) -> None:
    """A qa run on the study's own warm start of `seed`: its data/ is a folder whose entries link the project's
    (world, benchmarks, ...) but for what the warm start made (data/curated, data/teacher_answers.parquet,
    data/rollouts, data/teachers), which link the warm start's, as models/sft and models/discriminator do;
    its dvc.lock is the project's with those outputs' digests replaced by the warm start's."""
    warm = warm_starts.folder(study, seed)
    data = folder / DATA
    if data.is_symlink() or data.is_file():
        data.unlink()  # never write into the project's data/ through a link
    data.mkdir(parents=True, exist_ok=True)
    replaced = {rel for rel in warm_starts.QA_OUTPUTS if rel.parts[0] == DATA.name}
    for entry in sorted((study.project / DATA).iterdir()) if (study.project / DATA).is_dir() else []:
        if DATA / entry.name not in replaced:
            _link(entry, data / entry.name)
    for rel in warm_starts.QA_OUTPUTS:
        if (warm / rel).exists():
            _link(warm / rel, folder / rel)
        elif (folder / rel).is_symlink():
            (folder / rel).unlink()
    write_lock(study.project, folder, warm_starts.digests(study, seed))


def write_lock(project: Path, folder: Path, digests: dict[str, str]) -> None:
    """The project's dvc.lock in `folder` (a file), the outputs in `digests` recorded by their content there:
    what a stage logs as its inputs' digests (tracking.input_digest) is what this run reads."""
    import yaml

    from protege.dvc_lockfile import parse_dvc_file, read_dvc_lock

    lock = folder / DVC_LOCK
    if lock.is_symlink() or lock.exists():
        lock.unlink()
    text = read_dvc_lock(project)
    doc = parse_dvc_file(text) if text is not None else None
    if not isinstance(doc, dict):
        return
    for stage in (doc.get("stages") or {}).values():
        if isinstance(stage, dict) and isinstance(stage.get("outs"), list):
            stage["outs"] = [{"path": out["path"], "md5": digests[out["path"]]}
                             if isinstance(out, dict) and out.get("path") in digests else out for out in stage["outs"]]
    tmp = lock.with_name(lock.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, lock)


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False))
    os.replace(tmp, path)


def _bench_units(name: str, folder: Path, items, protocol: str) -> dict:
    """One benchmark's units (id -> score) as the evaluation wrote them, with categories where the
    benchmark's score is a mean over categories (MMStar)."""
    from protege.eval.scorers import scorer_for, suite_protocol

    summary = json.loads((folder / "summary.json").read_text())
    units = json.loads((folder / "units.json").read_text())
    out = {"score": summary["score"], "ci": summary["ci"], "aggregate": summary["aggregate"], "units": units}
    if summary["aggregate"] == "macro":
        scorer = scorer_for(name, suite_protocol(name, protocol))
        cats = {it.index: scorer.unit_category(it) for it in items}
        out["categories"] = {u: cats.get(u, "") for u in units}
    return out


def evaluate_models(cfg, root: Path, models: dict[str, Path], label: str) -> dict:
    """Each model on the world's test split (per-item correctness) and on the benchmark suite (per-unit
    scores, the 14-benchmark average with its CI)."""
    from protege.data.loader import workers_of_rank
    from protege.data.rows import load_rows
    from protege.eval.accuracy import evaluate_rows
    from protege.eval.suite import benchmark_files, completer_for, evaluate_model, grader_prompt, load_suite
    from protege.models.student import load_student

    ev = cfg.evaluate
    suite = load_suite(benchmark_files(ev, root), mini=ev.benchmarks == "mini")
    complete, grader = completer_for(ev.judge, root, cfg.seed), grader_prompt(ev, root)
    rows = load_rows(root / split_table(cfg.data.source, "test"))
    out = {}
    for name, rel in models.items():
        model, processor = load_student(root / rel)
        eval_dir = root / "eval" / name
        summary = evaluate_model(model, processor, suite, ev, eval_dir, complete, cfg.seed, grader=grader,
                                 log=lambda m, n=name: say(f"{label} {n} {m}"))
        world, items = evaluate_rows(model, processor, rows, ev.batch_size, ev.max_new_tokens,
                                     workers=workers_of_rank(cfg.data.workers))
        (eval_dir / "world_test.jsonl").write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items))
        out[name] = {
            "path": str(rel),
            "world_test": {"accuracy": world["accuracy"], "chance": world["chance"], "per_kind": world["per_kind"],
                           "n": world["items"], "mean_tokens": world["mean_tokens"],
                           "correct": {i["id"]: i["correct"] for i in items}},
            "average": summary["average"], "average_ci": summary["average_ci"],
            "mean_tokens": summary["mean_tokens"],
            "benchmarks": {b: _bench_units(b, eval_dir / b, suite[b], ev.protocol) for b in suite},
        }
        say(f"{label} {name}: world test {100 * world['accuracy']:.1f}%, benchmark average "
            f"{summary['average']:.1f} [{summary['average_ci'][0]:.1f}, {summary['average_ci'][1]:.1f}]")
    return out


def read_curve(path: Path) -> list[dict] | None:
    """A stage's per-step figures (its train_curve.csv) as rows, each without the figures its step did not log."""
    if not path.exists() or not path.stat().st_size:
        return None
    import pandas as pd

    frame = pd.read_csv(path)
    return [{k: (int(v) if k == "step" else float(v)) for k, v in row.items() if not pd.isna(v)
             and isinstance(v, (int, float))} for row in frame.to_dict("records")]


def upstream_metrics(project: Path) -> dict[str, dict]:
    """The figures of the shared upstream stages a precondition may read (the discriminator's held-out AUROC),
    as reports/stages/<stage>.json holds them in the project (or in the run's own warm start's folder)."""
    out = {}
    for stage in ("disc_pretrain",):
        path = project / STAGE_METRICS / f"{stage}.json"
        if path.exists():
            out[stage] = json.loads(path.read_text())
    return out


def run_upstream_metrics(study: Study, run: RunSpec) -> dict[str, dict]:
    """The upstream figures of the warm start `run` plays from: its study's own (warm_start_seeds), or the
    project's."""
    return upstream_metrics(warm_starts.root(study, run.warm_seed))


def cleanup(study: Study, folder: Path) -> None:
    if not study.keep_checkpoints:
        for rel in (RL_CHECKPOINTS, MERGED_MODEL, AGENT_RL, TOOL_RL):
            if (folder / rel).exists():
                shutil.rmtree(folder / rel)


@contextmanager
def child_run(study: Study, planned: Planned, parent_run_id: str | None):
    """The run's nested MLflow run under the study's parent (the same one again when a killed run resumes),
    with its variant, seed and overrides as params."""
    run, folder = planned.run, planned.folder
    previous = (folder / MLFLOW_RUN).read_text().strip() if (folder / MLFLOW_RUN).exists() else None
    tags = {tracking.STUDY_TAG: study.name, "protege.variant": run.variant, "protege.seed": str(run.seed),
            "protege.stage": "study-run"}
    with tracking.study_child_run(study.project, parent_run_id, run.key, tags, run_id=previous,
                                  log_models=study.keep_checkpoints, root=folder) as mlrun:
        (folder / MLFLOW_RUN).write_text(mlrun.run_id + "\n")
        mlrun.log_params({"variant": run.variant, "seed": run.seed, "train": run.train, **run.overrides})
        yield mlrun


def execute(study: Study, planned: Planned, parent_run_id: str | None) -> Path:
    """Runs one (variant, seed) in this process: RL + merge (unless `train: false`), evaluation, result.json.
    Returns the result's path; a finished run is skipped."""
    from protege.stages import merge as merge_stage
    from protege.stages import rl as rl_stage
    from protege.stages.rl import CURVE, train_curve

    run, folder = planned.run, planned.folder
    if planned.finished:
        say(f"{run.key}: finished earlier, skipped ({folder / RESULT})")
        cleanup(study, folder)
        return folder / RESULT
    prepare_folder(study, planned)
    if study.task in GAME_TASKS:
        return execute_agent(study, planned, parent_run_id)
    cfg = run.config
    t0 = time.perf_counter()
    with child_run(study, planned, parent_run_id) as mlrun:
        if run.train:
            say(f"{run.key}: training ({'resuming' if (folder / RL_CHECKPOINTS).exists() else 'fresh'}) in {folder}")
            rl_stage.run(cfg, folder, mlrun)
            merge_stage.run(cfg, folder, mlrun)
            last = checkpoints(folder / RL_CHECKPOINTS)[-1]
            models = {"rl_final": last.relative_to(folder), "merged": MERGED_MODEL}
        else:
            models = {"sft": SFT_MODEL}
        results = evaluate_models(cfg, folder, models, run.key)
        for name, r in results.items():
            mlrun.log_metrics({f"{name}.world_test.accuracy": r["world_test"]["accuracy"],
                               f"{name}.average": r["average"],
                               **{f"{name}.{b}.score": s["score"] for b, s in r["benchmarks"].items()}})
        headline = results.get(study.model) or results["sft"]
        mlrun.log_metrics({"world_test.accuracy": headline["world_test"]["accuracy"],
                           "benchmark_average": headline["average"]})
        rl_summary = folder / STAGE_METRICS / "rl.json"
        result = {"study": study.name, "variant": run.variant, "seed": run.seed, "train": run.train,
                  "fingerprint": planned.fingerprint, "overrides": run.overrides, "mlflow_run_id": mlrun.run_id,
                  "seconds": time.perf_counter() - t0, "finished_at": datetime.now(timezone.utc).isoformat(),
                  "rl": json.loads(rl_summary.read_text()) if run.train and rl_summary.exists() else None,
                  "curve": read_curve(folder / train_curve(CURVE)) if run.train else None,
                  "upstream_metrics": run_upstream_metrics(study, run), "models": results}
        write_json_atomic(folder / RESULT, result)
    cleanup(study, folder)
    say(f"{run.key}: finished in {result['seconds']:.0f} s -> {folder / RESULT}")
    return folder / RESULT


def execute_agent(study: Study, planned: Planned, parent_run_id: str | None) -> Path:
    """One game run (`task: agent` or `tool`): the agent_rl recipe on that game in the run folder (start and
    end evaluations, merged teacher), or with `train: false` the warm start's evaluation alone; result.json
    keeps every episode's outcome under the game's name."""
    from protege.eval.agent import evaluate_agent
    from protege.models.student import load_student
    from protege.stages import agent_rl
    from protege.stages.agent_rl import TRAIN_CURVE

    run, folder, cfg = planned.run, planned.folder, planned.run.config
    game, layout = study.task, GAMES[study.task]
    t0 = time.perf_counter()
    with child_run(study, planned, parent_run_id) as mlrun:
        if run.train:
            say(f"{run.key}: {game} RL ({'resuming' if (folder / layout.rl_dir).exists() else 'fresh'}) in {folder}")
            summary = agent_rl.train(cfg, folder, mlrun, game)
        else:
            model, processor = load_student(folder / layout.sft_model)
            summary = {"start": evaluate_agent(model, processor, layout.config(cfg), cfg.world.image_size,
                                               seed=cfg.seed)}
        headline = model_result({game: summary}, study.model)
        mlrun.log_metrics({k: headline[k] for k in ("success_rate", "entropy", "accuracy", "runtime_error_rate",
                                                     "tool_calls_per_episode") if k in headline})
        result = {"study": study.name, "variant": run.variant, "seed": run.seed, "train": run.train,
                  "fingerprint": planned.fingerprint, "overrides": run.overrides, "mlflow_run_id": mlrun.run_id,
                  "seconds": time.perf_counter() - t0, "finished_at": datetime.now(timezone.utc).isoformat(),
                  "curve": read_curve(folder / layout.report / TRAIN_CURVE) if run.train else None, game: summary}
        write_json_atomic(folder / RESULT, result)
    cleanup(study, folder)
    figures = (f"accuracy {100 * headline['accuracy']:.1f}%, runtime errors in "
               f"{100 * headline['runtime_error_rate']:.1f}% of episodes" if "runtime_error_rate" in headline else
               f"success {100 * headline['success_rate']:.1f}%")
    say(f"{run.key}: finished in {result['seconds']:.0f} s: {figures} -> {folder / RESULT}")
    return folder / RESULT


def worker_command(study: Study, run: RunSpec, parent_run_id: str | None, threads: int = 1) -> list[str]:
    return [sys.executable, "-m", "protege.study.runner", "--study", str(study.path), "--project", str(study.project),
            *(["--part", study.part] if study.part else []), "--variant", run.variant, "--seed", str(run.seed),
            "--parent", parent_run_id or "", "--threads", str(threads)]


def execute_isolated(study: Study, planned: Planned, parent_run_id: str | None, threads: int = 1) -> Path:
    """`execute` in its own process (torch with `threads` threads), its output prefixed with the run's key
    and kept in the run folder's log.txt."""
    if planned.finished:
        return execute(study, planned, parent_run_id)
    planned.folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    tail: collections.deque[str] = collections.deque(maxlen=30)
    with open(planned.folder / LOG, "a") as log, subprocess.Popen(
            worker_command(study, planned.run, parent_run_id, threads), env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            sys.stdout.write(f"[{planned.run.key}] {line}")
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))
    if proc.returncode != 0:
        detail = "\n".join(tail)
        raise RunFailed(f"{planned.run.key} failed (exit {proc.returncode}); log {planned.folder / LOG}:\n{detail}")
    return planned.folder / RESULT


# ---------------------------------------------------------------------------------------------- the study


def open_study(study: Study) -> str:
    """The study's MLflow parent run (the same one again when a killed study is re-run)."""
    state_path = study.out_dir / STATE
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    params = {"study_file": str(study.path), "seeds": study.seeds, "baseline": study.baseline, "model": study.model,
              "variants": list(study.variants), "common": study.common}
    parent = tracking.open_study_run(study.project, study.name, params, state.get("parent_run_id"))
    study.out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(state_path, {"parent_run_id": parent, "study_file": str(study.path)})
    return parent


def read_open_study(study: Study) -> str | None:
    """The study's MLflow parent run as open_study last recorded it (None if it never ran)."""
    try:
        return json.loads((study.out_dir / STATE).read_text()).get("parent_run_id")
    except (OSError, ValueError):
        return None


def finish_study(study: Study, parent_run_id: str | None, failed: list[str] | None = None) -> dict[str, Path]:
    """The report from every finished run (reports/study/<name>.{md,json,png}); closes the parent run."""
    from protege.study.report import build_report, headline_metrics, write_report

    results = {p.run.key: r for p in plan(study) if p.finished and (r := read_result(p.folder)) is not None}
    report = build_report(study, results, failed or [])
    paths = write_report(report, study.report_paths())
    if parent_run_id:
        tags = {f"claim.{i}": f"{c['name']}: " + (f"{c['verdict']} ({c['diff']:+.2f} [{c['ci'][0]:+.2f}, "
                                                  f"{c['ci'][1]:+.2f}] points)" if c.get("verdict") else "no result")
                for i, c in enumerate(report["claims"])}
        tracking.close_study_run(study.project, parent_run_id, "FAILED" if failed else "FINISHED",
                                 headline_metrics(report), tags, list(paths.values()))
    say(f"report: {paths['md']} ({len(results)} of {len(study.runs())} runs finished"
        + (f"; failed: {', '.join(failed)}" if failed else "") + ")")
    return paths


def run_key(study: Study, run: RunSpec) -> str:
    """A run's name across a file's parts: `<part>:<variant>/seed-<k>` (the variant's key in a one-study file)."""
    return f"{study.part}:{run.key}" if study.part else run.key


def finished_record(study: Study, planned: Planned) -> estimate.Finished | None:
    result = read_result(planned.folder)
    if not result or result.get("fingerprint") != planned.fingerprint or not result.get("seconds"):
        return None
    return estimate.Finished(study.task, study.part, planned.run.train, float(result["seconds"]),
                             estimate.work(planned.run.config, study.task))


def expected_time(studies: list[Study], pending: list[tuple[Study, Planned]], finished: list[estimate.Finished],
                  jobs: int, running: bool = False, warm: list[tuple[Study, int]] = ()) -> str:
    """The queue's expected wall time, from the finished runs or the project's own RL stage records, after the
    `warm` starts (study, seed) still to train, each costing what the project's own warm-start stages took."""
    priors: dict[str, float | None] = {}
    for s in studies:
        try:
            params = load_config(s.project / "params.yaml")
        except (ConfigError, OSError):
            params = None
        # the project's RL stage scales only to runs of its own game and output length (a game part of its own
        # plays another): compared with the study's first trained variant
        like = next((v.config for v in s.variants.values() if v.train), None)
        priors[s.name] = estimate.stage_rate(s.project, s.task, params, like) if params else None
    times = [estimate.run_seconds(s.task, s.part, p.run.train, estimate.work(p.run.config, s.task), finished,
                                  priors[s.name]) for s, p in pending]
    warm_times = [estimate.warm_start_seconds(s.project, warm_starts.stages(s.task)) for s, _ in warm]
    line = estimate.describe(times, jobs, len(finished), warm_times)
    return line.replace(" to do,", " left,", 1) if running else line


def pending_warm_starts(studies: list[Study], plans: dict[str, list[Planned]]) -> list[tuple[Study, int]]:
    """The warm starts (study, seed) the planned unfinished runs play from that are not trained yet."""
    return [(s, w) for s in studies for w in warm_starts.pending(s, [p.run for p in plans[s.name] if not p.finished])]


def describe_warm_starts(study: Study, runs: list[RunSpec]) -> list[str]:
    """One line per warm-start seed of the study (for --dry-run): the project's, trained, or to train before
    the `runs` (the unfinished ones) start, with the stages it runs and its expected time."""
    todo = set(warm_starts.pending(study, runs))
    steps = warm_starts.stages(study.task)
    seconds = estimate.warm_start_seconds(study.project, steps) if todo else None
    game = warm_starts.describe_game(study, " under ")
    try:
        project_seed = load_config(study.project / "params.yaml").seed
    except (ConfigError, OSError):
        project_seed = None
    out = []
    for w in study.warm_start_seeds:
        if warm_starts.is_projects(study, w):
            what = f"the project's own (params.yaml seed {w}), linked"
        elif w in todo:
            what = (f"to train: {', '.join(steps)}{game} into {warm_starts.folder(study, w)}"
                    + (f", about {estimate.minutes(seconds)}" if seconds is not None else "")
                    + (f" (params.yaml's seed, but not the project's {GAMES[study.task].sft_model}: that one "
                       f"plays params.yaml's game)" if w == project_seed else ""))
        elif warm_starts.finished(study, w):
            what = f"trained{game} ({warm_starts.folder(study, w)})"
        else:
            what = "not trained; no unfinished run plays from it"
        out.append(f"warm start {w}: {what}")
    return out


def describe_game(study: Study) -> str | None:
    """The game a game study plays (for --dry-run): its own settings (`game:`) against params.yaml's, or
    params.yaml's; None for a qa study."""
    if study.task not in GAME_TASKS:
        return None
    from protege.study.spec import _lookup, describe

    try:
        project = load_config(study.project / "params.yaml").model_dump()
    except (ConfigError, OSError):
        project = None
    if not study.game:
        key = "agent.env" if study.task == "agent" else "tool.task.kinds"
        return f"game: params.yaml's ({describe({key: _lookup(project, key)})})" if project else "game: params.yaml's"
    theirs = describe({k: _lookup(project, k) for k in study.game}) if project else "?"
    if warm_starts.plays_projects_game(study):
        return f"game: {describe(study.game)} (the part's own, as params.yaml has it: the project's warm start stands)"
    return (f"game: {describe(study.game)} (the part's own, over params.yaml's {theirs}): every run plays it, and "
            f"its warm starts are trained under it")


def describe_precondition(pre) -> str:
    """A precondition's fields as the study file fixes them, and its criterion in words."""
    from protege.study.preconditions import criterion
    from protege.study.spec import KIND_FIELDS

    fields = [f"variant {pre.variant}", f"metric {pre.metric}", f"kind {pre.kind}"]
    for key in KIND_FIELDS[pre.kind]:
        value = getattr(pre, key)
        if value is not None and not (key == "at" and "." in pre.metric):
            fields.append(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}")
    rule = "more than half of the seeds" if pre.seeds == "majority" else "every seed"
    return f"{pre.name} ({', '.join(fields)}): met when {criterion(pre)}, on {rule}"


def describe_claims(study: Study) -> list[str]:
    """Each claim of the study (for --dry-run) with every precondition it requires, then the preconditions no
    claim requires (measured and reported only)."""
    from protege.study.spec import LOWER_IS_BETTER

    pres = {p.name: p for p in study.preconditions}
    out = []
    for c in study.claims:
        diff = f"{c.than} - {c.better}" if c.metric in LOWER_IS_BETTER else f"{c.better} - {c.than}"
        bar = f"above -{c.margin:g}" if c.margin else "above 0"
        out.append(f'claim "{c.name}": {diff} on {c.metric} ({c.model}), reproduced when its CI lies {bar}'
                   + ("" if c.requires else "; no preconditions"))
        out += [f"  requires {describe_precondition(pres[name])}" for name in c.requires]
    required = {name for c in study.claims for name in c.requires}
    out += [f"precondition required by no claim (reported): {describe_precondition(p)}"
            for p in study.preconditions if p.name not in required]
    return out


def queue_estimate(studies: list[Study], plans: dict[str, list[Planned]], jobs: int) -> str:
    """The expected-time line for `plans` (each study's planned runs, by study name) run `jobs` at a time,
    after the warm starts they need."""
    pending = [(s, p) for s in studies for p in plans[s.name] if not p.finished]
    finished = [f for s in studies for p in plans[s.name] if p.finished and (f := finished_record(s, p)) is not None]
    return expected_time(studies, pending, finished, jobs, warm=pending_warm_starts(studies, plans))


def run_study(study: Study | Suite, jobs: int = 1, isolated: bool = True) -> dict[str, Path]:
    """The whole study (or every part of a file with parts) without Prefect (the flow in flows/study.py does
    the same with one task per run): pending runs one by one (or `jobs` at once, each in its own process,
    the parts' runs in one queue), then each part's report and the file's claims table."""
    from contextlib import ExitStack

    from protege.study import services

    suite = study if isinstance(study, Suite) else None
    studies = suite.studies if suite else [study]
    pending: list[tuple[Study, Planned]] = []
    finished: list[estimate.Finished] = []
    for s in studies:
        planned = plan(s)
        check_upstream(s, [p.run for p in planned if not p.finished])
        if warm := warm_starts.pending(s, [p.run for p in planned if not p.finished]):
            each = estimate.warm_start_seconds(s.project, warm_starts.stages(s.task))
            say(f"{s.part + ': ' if s.part else ''}{len(warm)} warm start(s) to train first (seed "
                f"{', '.join(map(str, warm))})" + (f": expected about {estimate.minutes(each * len(warm))}"
                                                   if each is not None else ""))
        warm_starts.ensure(s, [p.run for p in planned if not p.finished], log=say)
        for p in planned:
            if p.finished:
                say(f"{run_key(s, p.run)}: finished earlier, skipped")
                cleanup(s, p.folder)
                if (record := finished_record(s, p)) is not None:
                    finished.append(record)
            else:
                pending.append((s, p))
    say(expected_time(studies, pending, finished, jobs if isolated else 1))
    parents = {s.name: open_study(s) for s in studies}
    failed: dict[str, list[str]] = {s.name: [] for s in studies}
    left = list(pending)

    def one(item: tuple[Study, Planned]) -> None:
        s, p = item
        try:
            (execute_isolated if isolated else execute)(s, p, parents[s.name])
        except Exception as exc:  # the other runs go on; the study reports what finished and fails
            failed[s.name].append(p.run.key)
            say(f"{run_key(s, p.run)}: FAILED: {exc}")
        left.remove(item)
        if (record := finished_record(s, p)) is not None:
            finished.append(record)
        if left:
            say(expected_time(studies, left, finished, jobs if isolated else 1, running=True))

    try:
        with ExitStack() as stack:
            for s in studies:
                stack.enter_context(services.running(s, [p.run.config for t, p in pending if t is s], log=say))
            if jobs > 1 and isolated:
                with ThreadPoolExecutor(jobs) as pool:
                    list(pool.map(one, pending))
            else:
                for item in pending:
                    one(item)
    except BaseException:
        for s in studies:
            tracking.close_study_run(s.project, parents[s.name], "KILLED")
        raise
    paths = {}
    for s in studies:
        paths = finish_study(s, parents[s.name], failed[s.name])
    if suite is not None and suite.has_parts:
        paths = finish_suite(suite)
    bad = [f"{s.part}:{k}" if s.part else k for s in studies for k in failed[s.name]]
    if bad:
        raise RunFailed(f"{len(bad)} run(s) failed: {', '.join(bad)}; re-run the study to retry them "
                        f"(finished runs are kept); report of the rest: {paths['md']}")
    return paths


def finish_suite(suite: Suite) -> dict[str, Path]:
    """Every part's claims in one table (the file's `report`, e.g. reports/results.md, and its JSON beside
    reports/study/<name>.md), from the parts' reports as finish_study last wrote them."""
    from protege.study.curves import figure_path
    from protege.study.results import suite_figure, suite_markdown

    reports = {}
    for s in suite.studies:
        path = s.report_paths()["json"]
        reports[s.part] = json.loads(path.read_text()) if path.exists() else None
    paths = suite.report_paths()
    paths["md"].parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(paths["json"], {"suite": suite.name, "file": str(suite.path), "parts": reports})
    for s in suite.studies:  # the parts' curve pictures beside the file's report
        for key in (reports[s.part] or {}).get("figures", []):
            picture = figure_path(s.report_paths()["md"], key)
            if picture.exists():
                shutil.copyfile(picture, suite_figure(suite, s.part or s.name, key))
    paths["md"].write_text(suite_markdown(suite, reports))
    say(f"claims of {len(suite.studies)} parts: {paths['md']}")
    return paths


def main(argv: list[str] | None = None) -> int:
    """One run in this process (what `execute_isolated` starts)."""
    ap = argparse.ArgumentParser(description="one run of a study")
    ap.add_argument("--study", required=True)
    ap.add_argument("--project", default=".")
    ap.add_argument("--part", default=None, help="the study's key under `parts:` in a file with parts")
    ap.add_argument("--variant", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--parent", default="")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    from protege.runtime.parent_watch import exit_with_parent

    exit_with_parent()  # a study killed mid-run must not leave this run writing its folder
    torch.set_num_threads(args.threads)
    study = load_study(args.study, args.project, args.part)
    run = study.find_run(args.variant, args.seed)
    planned = next(p for p in plan(study) if p.run.key == run.key)
    try:
        execute(study, planned, args.parent or None)
    except (UserFacingError, FileNotFoundError, FloatingPointError) as exc:
        print(f"error: {run.key}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
