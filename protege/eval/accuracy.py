"""Accuracy of a student on a question split (greedy, batched), with chance level for reference."""
from __future__ import annotations

from collections import defaultdict

from protege.data.loader import image_batches
from protege.data.rows import Row
from protege.generation.transformers_backend import Sampling, generate_answers
from protege.rewards.judge import extract, rule_judge


def evaluate_rows(model, processor, rows: list[Row], batch_size: int, max_new_tokens: int,
                  progress=None, workers: int = 0) -> tuple[dict, list[dict]]:
    """`workers`: processes decoding the next batches' images (protege.data.loader)."""
    texts, tokens, seconds = generate_answers(model, processor, [r.question for r in rows], None,
                                              Sampling(do_sample=False, max_new_tokens=max_new_tokens),
                                              batch_size, progress=progress,
                                              image_batches=image_batches(rows, batch_size, workers))
    items, by_kind = [], defaultdict(list)
    for r, text, n in zip(rows, texts, tokens):
        score = rule_judge(r.answer, text, r.candidates)
        items.append({"id": r.id, "kind": r.kind, "reference": r.answer, "prediction": text,
                      "extracted": extract(text, r.candidates) if r.candidates else None,
                      "correct": score, "tokens": n})
        by_kind[r.kind].append(score)
    n = max(1, len(rows))
    summary = {
        "accuracy": sum(i["correct"] for i in items) / n,
        "chance": sum(1 / len(r.candidates) for r in rows if r.candidates) / n,
        "per_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
        "items": len(rows),
        "mean_tokens": sum(tokens) / n,
        "seconds_per_answer": seconds / n,
    }
    return summary, items
