"""Builds a teacher backend from its params.yaml entry."""
from __future__ import annotations

from pathlib import Path

from protege.config import TeacherSpec
from protege.teachers.backends import SamplingParams, ScriptedTeacher, TeacherBackend, TransformersTeacher, VLLMTeacher


def build_teacher(spec: TeacherSpec, root: Path, error_rate: float, seed: int,
                  accounts: bool = False) -> TeacherBackend:
    """`error_rate` and `accounts` (world.accounts) concern the scripted teachers only."""
    sampling = SamplingParams(spec.temperature, spec.top_p, spec.max_tokens)
    if spec.backend == "scripted":
        return ScriptedTeacher(spec.name, error_rate, seed, sampling=sampling, style=spec.style or spec.name,
                               accounts=accounts)
    path = Path(spec.model)
    path = path if path.is_absolute() or spec.backend == "openai" else root / path
    if spec.backend == "transformers":
        return TransformersTeacher(spec.name, path, sampling, batch_size=spec.batch_size, seed=seed)
    if spec.backend == "vllm":
        return VLLMTeacher(spec.name, str(path), sampling, seed=seed, max_model_len=spec.max_model_len)
    from protege.teachers.openai_backend import OpenAITeacher

    return OpenAITeacher(spec.name, spec.base_url, spec.model, sampling, api_key_env=spec.api_key_env,
                         concurrency=spec.concurrency, timeout_s=spec.timeout_s, max_retries=spec.max_retries,
                         seed=seed)
