"""The row schemas protege reads and writes, as data: each column's type, nullability and limits.

Question rows (SFT pool, RL pool, test split) — one row per (image, question):
  id          str, unique            a stable id (importers derive it from the source id and turn)
  question    str, 1..MAX_QUESTION   the user turn, without the image placeholder
  answer      str, 1..MAX_ANSWER     the reference answer (SFT target; what the judge compares with)
  image       str                    path of the image, relative to the table's folder
  image_sha256 str (64 hex)          sha256 of the image bytes (dedup key with the question)
  kind        str                    question kind or source tag ("" when unknown)
  candidates  str (JSON list)        allowed short answers, when known ("[]" otherwise)
  options     str (JSON list)        option texts of a multiple-choice question, A, B, C... in order
  source      str                    "file:row" the row came from, for error messages

Teacher answers (the cache's training view): key, teacher, revision, question_id, sample_index, answer,
latency_s, prompt_tokens, completion_tokens, finish_reason in {stop, length}, truncated.

Benchmark rows (VLMEvalKit-style TSV): index, question, answer, image (base64), options A..J, category.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_QUESTION_CHARS = 4000
MAX_ANSWER_CHARS = 4000
MAX_IMAGE_SIDE = 4096
MIN_IMAGE_SIDE = 8
OPTION_LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str                          # "str" | "int" | "float" | "bool"
    nullable: bool = False
    min_length: int | None = None
    max_length: int | None = None
    allowed: tuple | None = None
    unique: bool = False
    min_value: float | None = None
    max_value: float | None = None


@dataclass(frozen=True)
class Schema:
    name: str
    columns: tuple[Column, ...]
    derived_checks: tuple[str, ...] = field(default_factory=tuple)  # computed boolean columns that must be True

    @property
    def required(self) -> list[str]:
        return [c.name for c in self.columns if not c.nullable]


QUESTION_ROWS = Schema("question_rows", (
    Column("id", "str", unique=True, min_length=1, max_length=200),
    Column("question", "str", min_length=1, max_length=MAX_QUESTION_CHARS),
    Column("answer", "str", min_length=1, max_length=MAX_ANSWER_CHARS),
    Column("image", "str", min_length=1),
), derived_checks=("image_readable", "image_size_ok", "answer_in_options", "parsed"))

TEACHER_ANSWERS = Schema("teacher_answers", (
    Column("key", "str", unique=True, min_length=64, max_length=64),
    Column("teacher", "str", min_length=1),
    Column("question_id", "str", min_length=1),
    Column("answer", "str", min_length=1, max_length=MAX_ANSWER_CHARS),
    Column("finish_reason", "str", allowed=("stop", "length")),
    Column("latency_s", "float", min_value=0),
    Column("sample_index", "int", min_value=0),
))

BENCHMARK_ROWS = Schema("benchmark_rows", (
    Column("index", "int", unique=True),
    Column("question", "str", min_length=1, max_length=MAX_QUESTION_CHARS),
    Column("answer", "str", min_length=1),
), derived_checks=("image_readable", "answer_in_options"))
