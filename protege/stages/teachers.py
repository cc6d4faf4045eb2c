"""teachers: N answers per curated question from each teacher, in a content-addressed cache.

Writes the cache (data/teachers/, kept across runs) and the training view (data/teacher_answers.parquet):
this run's answers with those cut off by the length limit or over curate.max_teacher_tokens dropped.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.markup import escape

from protege.config import Config
from protege.data.curate import answer_tokens
from protege.data.rows import image_path, image_paths, read_table
from protege.data.schemas import TEACHER_ANSWERS as TEACHER_ANSWER_ROWS
from protege.data.validate import DatasetInvalid, run_suite
from protege.errors import UserFacingError
from protege.models.processor import StudentProcessor
from protege.paths import CURATED_RL, TEACHER_ANSWERS, TEACHER_CACHE
from protege.stages.common import progress, say, write_stage_metrics
from protege.stages.student_model import base_model_dir
from protege.teachers.backends import TeacherRequest
from protege.files import file_sha256
from protege.teachers.cache import TeacherCache, TeacherCacheIncomplete, cache_key, repair_counts
from protege.teachers.factory import build_teacher

HASH_BATCH = 256  # images hashed between progress reports


def requests_for(questions: pd.DataFrame, table: Path, image_hashes: dict[str, str], backend,
                 processor: StudentProcessor, n: int) -> list[TeacherRequest]:
    out = []
    for rec in questions.to_dict("records"):
        img = image_path(table, rec["image"])
        rels = image_paths(rec)
        prompt = processor.prompt(rec["question"], len(rels))
        for k in range(n):
            key = cache_key(backend.name, backend.revision, prompt, [image_hashes[r] for r in rels],
                            backend.sampling.as_dict(), k)
            out.append(TeacherRequest(key, rec["id"], rec["question"], str(img), rec.get("kind", ""), rec["answer"],
                                      tuple(json.loads(rec.get("candidates") or "[]")), k,
                                      tuple(str(image_path(table, rel)) for rel in rels[1:]),
                                      facts if isinstance(facts := rec.get("facts"), str) else ""))
    return out


def hash_images(table: Path, questions: pd.DataFrame, run) -> dict[str, str]:
    """Each image path of the table -> its file's sha256 (what a cache key names the image by)."""
    rels = list(dict.fromkeys(rel for rec in questions.to_dict("records") for rel in image_paths(rec)))
    hashed = progress("teachers", run, "images_hashed", len(rels))
    out = {}
    for start in range(0, len(rels), HASH_BATCH):
        out.update((rel, file_sha256(image_path(table, rel))) for rel in rels[start:start + HASH_BATCH])
        hashed.update(len(rels[start:start + HASH_BATCH]))
    return out


def say_repairs(cache: TeacherCache, said: int = 0) -> int:
    """One line per repair the cache made since the first `said` (an index rebuilt, a shard distrusted: which,
    why, the answers dropped and how many were asked again); returns how many are said now."""
    for repair in cache.repairs[said:]:
        say("teachers", escape(repair.line(TEACHER_CACHE)))  # a file name in [brackets] is not rich markup
    return len(cache.repairs)


def run(cfg: Config, root: Path, run) -> None:
    run.log_params({"answers_per_question": cfg.teachers.answers_per_question, "error_rate": cfg.teachers.error_rate,
                    "pool": [t.model_dump(exclude_defaults=True) for t in cfg.teachers.pool]}, "teachers.")
    run.log_input(CURATED_RL, context="teachers")
    questions = read_table(root / CURATED_RL)
    processor = StudentProcessor.from_pretrained(base_model_dir(cfg, root), cfg.model.trust_remote_code)
    cache = TeacherCache(root / TEACHER_CACHE)
    image_hashes = hash_images(root / CURATED_RL, questions, run)
    metrics, views, incomplete, said = {}, [], [], 0
    for spec in cfg.teachers.pool:
        backend = build_teacher(spec, root, cfg.teachers.error_rate, cfg.seed, cfg.world.accounts)
        requests = requests_for(questions, root / CURATED_RL, image_hashes, backend, processor,
                                cfg.teachers.answers_per_question)
        say("teachers", f"{spec.name} ({spec.backend}): {len(requests)} answers wanted")
        asked = progress("teachers", run, f"{spec.name}.answers", None)
        try:
            stats = cache.fill(backend, requests, progress=asked.reached)
        except TeacherCacheIncomplete as exc:  # keep going: the other teachers' answers are worth having
            incomplete.append(str(exc))
            stats = {"failures": exc.missing, "requested": exc.total}
        answers = cache.load(spec.name)
        said = say_repairs(cache, said)
        answers = answers[answers["key"].isin({r.key for r in requests})].copy()
        answers["answer_tokens"] = [answer_tokens(processor, a) for a in answers["answer"]]
        over = answers["answer_tokens"] > cfg.curate.max_teacher_tokens
        truncated = answers["truncated"].astype(bool)
        empty = answers["answer"].str.strip() == ""
        views.append(answers[~over & ~truncated & ~empty])
        m = {"answers": len(answers), "requested": stats.get("requested", 0), "failures": stats.get("failures", 0),
             "dropped_over_cap": int(over.sum()), "dropped_truncated": int(truncated.sum()),
             "dropped_empty": int(empty.sum()),
             "mean_answer_tokens": float(answers["answer_tokens"].mean()) if len(answers) else 0.0,
             "p50_latency_s": float(answers["latency_s"].median()) if len(answers) else 0.0,
             "p95_latency_s": float(answers["latency_s"].quantile(0.95)) if len(answers) else 0.0}
        metrics.update({f"{spec.name}.{k}": v for k, v in m.items()})
        say("teachers", f"{spec.name}: {m['answers']} cached ({m['requested']} requested now, {m['failures']} failed), "
                        f"dropped {m['dropped_over_cap']} over the {cfg.curate.max_teacher_tokens}-token cap and "
                        f"{m['dropped_truncated']} cut off")
    counts = repair_counts(cache.repairs)
    metrics.update(counts)
    if cache.repairs:
        say("teachers", f"cache repaired: {counts['cache_shards_repaired']} shard(s) distrusted, "
                        f"{counts['cache_indexes_rebuilt']} index(es) rebuilt, {counts['cache_answers_dropped']} "
                        f"answer(s) dropped, {counts['cache_answers_reasked']} re-asked (each listed above)")
    run.log_metrics(metrics)
    if incomplete:  # after logging: what was received stays cached, and the stage fails with the count
        raise UserFacingError("\n".join(incomplete))
    view = pd.concat(views, ignore_index=True)
    _, failures = run_suite({str(TEACHER_ANSWERS): view}, TEACHER_ANSWER_ROWS, id_column="key")
    if failures:
        raise DatasetInvalid("teacher answers failed validation:\n" + "\n".join(f.line() for f in failures))
    view.to_parquet(root / TEACHER_ANSWERS, index=False)
    write_stage_metrics(root, "teachers", metrics)
