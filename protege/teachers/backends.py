"""Teacher backends. A backend answers requests; the cache decides which requests are needed."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from protege.world.teachers import scripted_answer


@dataclass(frozen=True)
class TeacherRequest:
    key: str
    question_id: str
    kind: str
    question: str
    reference: str
    candidates: tuple[str, ...]
    sample_index: int


@dataclass(frozen=True)
class TeacherAnswer:
    key: str
    text: str
    latency_s: float
    finish_reason: str


class TeacherBackend(Protocol):
    name: str
    revision: str

    def answer(self, requests: list[TeacherRequest]) -> list[TeacherAnswer]: ...


@dataclass
class ScriptedTeacher:
    """The embedded world's teachers: a verbal style, a configurable error rate, deterministic."""
    name: str
    error_rate: float
    seed: int
    revision: str = "scripted-v1"

    def answer(self, requests: list[TeacherRequest]) -> list[TeacherAnswer]:
        out = []
        for r in requests:
            t0 = time.perf_counter()
            text = scripted_answer(self.name, r.kind, r.reference, list(r.candidates), r.question_id,
                                   r.sample_index, self.error_rate, self.seed)
            out.append(TeacherAnswer(r.key, text, time.perf_counter() - t0, "stop"))
        return out
