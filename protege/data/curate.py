"""Curation of the RL pool: overlong filtering by the tokens the student will actually see."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from PIL import Image

from protege.data.rows import image_path, read_table
from protege.models.processor import StudentProcessor


def overlong_filter(table: Path, processor: StudentProcessor, max_tokens: int) -> tuple[pd.DataFrame, dict]:
    """Keeps rows whose chat-formatted prompt + image tokens + answer fit in `max_tokens`."""
    df = read_table(table)
    lengths = []
    for rec in df.to_dict("records"):
        with Image.open(image_path(table, rec["image"])) as im:
            lengths.append(processor.token_length(rec["question"], rec["answer"], im.convert("RGB")))
    df = df.assign(tokens=lengths)
    kept = df[df["tokens"] <= max_tokens].reset_index(drop=True)
    report = {"input_rows": len(df), "kept": len(kept), "dropped_overlong": len(df) - len(kept),
              "max_tokens": max_tokens, "mean_tokens": float(df["tokens"].mean()) if len(df) else 0.0}
    return kept, report


def answer_tokens(processor: StudentProcessor, answer: str) -> int:
    return len(processor.tokenizer(answer, add_special_tokens=False)["input_ids"])
