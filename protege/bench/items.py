"""The common shape of a benchmark question, whatever file it was read from, and of a scored answer.

Readers (`protege.eval.readers`) turn VLMEvalKit TSVs and lmms-eval parquet/JSON layouts into
`BenchItem`s; scorers (`protege.eval.scorers`) turn (item, prediction) into `Scored`; the report
(`protege.eval.report`) resamples `Unit`s for its confidence intervals.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The 14 benchmarks of the RIL paper, by the name used in params.yaml, the CLI and the report.
BENCHMARKS = ("ai2d", "chartqa", "mathvista", "mmbench", "mmbench_cn", "mmvet", "mmvet_v2", "mmmu",
              "mmmu_pro", "mmstar", "blink", "seedbench", "seedbench2_plus", "realworldqa")


@dataclass
class BenchItem:
    benchmark: str                 # one of BENCHMARKS
    index: str                     # the file's own id as a string (TSV index, MathVista pid, MMMU id, ...)
    question: str                  # the question as the benchmark states it, options not appended
    images: list[bytes]            # encoded images (PNG/JPEG bytes) in the order the question refers to them
    answer: str                    # gold answer: an option letter for multiple choice, else the answer text
    options: dict[str, str] = field(default_factory=dict)  # ordered letter -> option text; {} if open
    hint: str = ""                 # context shown before the question (MMBench/SEED hint column)
    category: str = ""
    l2_category: str = ""
    difficulty: str = ""           # "" where the benchmark gives none
    group: str = ""                # items scored together (MMBench circular copies: index % 1_000_000)
    meta: dict = field(default_factory=dict)  # protocol extras: question_type, answer_type, precision,
    #                                           choices, unit, answers (list), capability, ...
    source: str = ""               # file it came from (for error messages)
    row: int = 0                   # 1-based data row in that file (for error messages)

    @property
    def where(self) -> str:
        return f"{self.source}: row {self.row} (index {self.index})"


@dataclass
class Scored:
    index: str
    extracted: str                 # what the scorer read from the prediction ("" when nothing)
    score: float                   # in [0, 1]
    note: str = ""                 # how it was decided when not by the main rule ("judge", "no letter found")


@dataclass
class Unit:
    """What the bootstrap resamples: one question, or one circular group of MMBench copies."""
    id: str
    score: float                   # in [0, 1]
    category: str = ""
    difficulty: str = ""
