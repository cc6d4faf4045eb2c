"""rollouts: N sampled student answers per curated question (for discriminator pretraining)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from protege.config import Config, tracked_params
from protege.data.loader import image_batches, workers_of_rank
from protege.data.rows import load_rows
from protege.generation.transformers_backend import Sampling, generate_answers

from protege.paths import CURATED_RL, ROLLOUTS, SFT_MODEL
from protege.stages.common import progress, say, write_stage_metrics
from protege.stages.student_model import load_model

BATCH = 32  # questions a generation batch holds


def run(cfg: Config, root: Path, run) -> None:
    c = cfg.rollouts
    run.log_params(tracked_params(c), "rollouts.")
    run.log_input(CURATED_RL, context="questions")
    run.log_input(SFT_MODEL, context="student")
    torch.manual_seed(cfg.seed)
    model, processor = load_model(cfg, root / SFT_MODEL)
    rows = load_rows(root / CURATED_RL)
    processor.check_images(rows, str(CURATED_RL))
    if c.generation == "vllm":  # an engine samples in the student's place, its weights synced from the student
        from protege.generation.vllm_backend import generator_from_model, image_limit

        # curate dropped every question longer than curate.max_tokens (prompt, image and reference answer)
        model = generator_from_model(model, processor, seed=cfg.seed, memory=c.vllm_memory,
                                     max_model_len=c.vllm_max_model_len or cfg.curate.max_tokens + c.max_new_tokens,
                                     images_per_prompt=image_limit(model, [r.image_count for r in rows]))
    sampling = Sampling(do_sample=True, temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
                        max_new_tokens=c.max_new_tokens)
    answered = progress("rollouts", run, "questions", len(rows))
    texts, tokens, seconds = generate_answers(
        model, processor, [r.question for r in rows], None, sampling, batch_size=BATCH,
        num_return_sequences=c.samples_per_question, progress=answered.reached,
        image_batches=image_batches(rows, BATCH, workers_of_rank(cfg.data.workers)))
    if c.generation == "vllm":
        model.close()
    n = c.samples_per_question
    df = pd.DataFrame([{"question_id": r.id, "sample_index": k, "answer": texts[i * n + k], "tokens": tokens[i * n + k]}
                       for i, r in enumerate(rows) for k in range(n)])
    (root / ROLLOUTS).parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(root / ROLLOUTS, index=False)
    metrics = {"answers": len(df), "seconds": seconds, "answers_per_s": len(df) / max(seconds, 1e-9),
               "mean_tokens": float(df["tokens"].mean())}
    run.log_metrics(metrics)
    write_stage_metrics(root, "rollouts", metrics)
    say("rollouts", f"{len(df)} answers in {seconds:.1f} s -> {ROLLOUTS}")
