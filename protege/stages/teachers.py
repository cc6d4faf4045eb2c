"""teachers: N answers per curated question from each teacher, in a content-addressed cache."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from protege.config import Config
from protege.data.curate import answer_tokens
from protege.data.rows import image_path, read_table
from protege.models.processor import StudentProcessor
from protege.paths import BASE_MODEL, CURATED_RL, TEACHER_CACHE
from protege.stages.common import say, write_stage_metrics
from protege.teachers.backends import ScriptedTeacher, TeacherRequest
from protege.teachers.cache import TeacherCache, cache_key, file_sha256


def run(cfg: Config, root: Path, run) -> None:
    run.log_params(cfg.teachers.model_dump(), "teachers.")
    run.log_input(CURATED_RL, context="teachers")
    questions = read_table(root / CURATED_RL)
    processor = StudentProcessor.from_pretrained(root / BASE_MODEL)
    cache = TeacherCache(root / TEACHER_CACHE)
    sampling = {"temperature": 1.0, "n": cfg.teachers.answers_per_question}
    metrics = {}
    for name in cfg.teachers.names:
        backend = ScriptedTeacher(name, cfg.teachers.error_rate, cfg.seed)
        requests = []
        for rec in questions.to_dict("records"):
            img_hash = file_sha256(image_path(root / CURATED_RL, rec["image"]))
            prompt = processor.prompt(rec["question"])
            for k in range(cfg.teachers.answers_per_question):
                requests.append(TeacherRequest(cache_key(name, backend.revision, prompt, img_hash, sampling, k),
                                               rec["id"], rec.get("kind", ""), rec["question"], rec["answer"],
                                               tuple(json.loads(rec.get("candidates") or "[]")), k))
        stats = cache.fill(backend, requests)
        answers = cache.load(name)
        lengths = [answer_tokens(processor, a) for a in answers["answer"]]
        over = sum(n > cfg.curate.max_teacher_tokens for n in lengths)
        metrics.update({f"{name}.requested": stats["requested"], f"{name}.answers": len(answers),
                        f"{name}.over_cap": over, f"{name}.mean_tokens": statistics.fmean(lengths) if lengths else 0.0,
                        f"{name}.p50_latency_s": statistics.median(answers["latency_s"]) if len(answers) else 0.0})
        say("teachers", f"{name}: {len(answers)} answers cached, {stats['requested']} newly requested, "
                        f"{over} over the {cfg.curate.max_teacher_tokens}-token cap")
    run.log_metrics(metrics)
    write_stage_metrics(root, "teachers", metrics)
