"""Teacher backends behind one interface.

A backend answers a list of requests and reports each outcome through a callback as soon as it has it
(an answer, or a failure after its retries), so the cache can persist work while the rest is running.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from protege.errors import UserFacingError
from protege.teachers.digest import weights_digest
from protege.world.teachers import behaviour_digest, scripted_answer


@dataclass(frozen=True)
class TeacherRequest:
    key: str
    question_id: str
    question: str
    image_path: str | None = None
    kind: str = ""
    reference: str = ""            # only the scripted teachers look at it
    candidates: tuple[str, ...] = ()
    sample_index: int = 0
    extra_image_paths: tuple[str, ...] = ()  # a question about several images: the second one onwards
    facts: str = ""                # JSON: what the image shows (world questions); only the scripted teachers read it

    @property
    def image_paths(self) -> list[str]:
        return ([self.image_path] if self.image_path else []) + list(self.extra_image_paths)


@dataclass(frozen=True)
class TeacherAnswer:
    key: str
    text: str
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str             # "stop" | "length" (cut off by the token limit)


@dataclass(frozen=True)
class TeacherFailure:
    key: str
    error: str
    attempts: int
    # "empty": the server answered with no text (a judge's blank reply, which the harnesses score);
    # "truncated": no text because the token limit ran out first; "error": no answer at all
    kind: str = "error"


Outcome = TeacherAnswer | TeacherFailure


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}


class TeacherBackend(Protocol):
    name: str
    revision: str
    sampling: SamplingParams

    def run(self, requests: list[TeacherRequest], on_outcome: Callable[[Outcome], None]) -> None: ...


@dataclass
class ScriptedTeacher:
    """The embedded world's teachers: a verbal style, a configurable error rate, deterministic; with `accounts`
    an account of the image before the final answer, where a request carries the question's facts."""
    name: str
    error_rate: float
    seed: int
    revision: str = ""  # default: a digest of what decides its answers (so a change is asked anew)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    style: str = ""  # "concise" | "verbose"; defaults to the name (two teachers may share a style)
    accounts: bool = False  # world.accounts

    def __post_init__(self) -> None:
        self.style = self.style or self.name
        self.revision = self.revision or "scripted-" + behaviour_digest(self.style, self.error_rate, self.seed,
                                                                         self.accounts)

    def run(self, requests: list[TeacherRequest], on_outcome: Callable[[Outcome], None]) -> None:
        for r in requests:
            t0 = time.perf_counter()
            facts = json.loads(r.facts) if self.accounts and r.facts else None
            text = scripted_answer(self.style, r.kind, r.reference, list(r.candidates), r.question_id,
                                   r.sample_index, self.error_rate, self.seed, facts)
            on_outcome(TeacherAnswer(r.key, text, time.perf_counter() - t0, len(r.question.split()),
                                     len(text.split()), "stop"))


@dataclass
class TransformersTeacher:
    """A local checkpoint (any student-family model folder) answering with batched sampling."""
    name: str
    model_path: Path
    sampling: SamplingParams = field(default_factory=SamplingParams)
    batch_size: int = 32
    seed: int = 0
    revision: str = ""

    def __post_init__(self) -> None:
        from protege.models.student import load_student

        self.model, self.processor = load_student(self.model_path)
        if not self.revision:  # the weights' hash: a retrained checkpoint is a new teacher revision
            self.revision = weights_digest(self.model_path)

    def run(self, requests: list[TeacherRequest], on_outcome: Callable[[Outcome], None]) -> None:
        import torch
        from PIL import Image

        from protege.generation.transformers_backend import Sampling, sample

        s = Sampling(do_sample=self.sampling.temperature > 0, temperature=max(self.sampling.temperature, 1e-5),
                     top_p=self.sampling.top_p, top_k=0, max_new_tokens=self.sampling.max_tokens)
        torch.manual_seed(self.seed)
        stops = torch.tensor(self.processor.stop_token_ids)
        for i in range(0, len(requests), self.batch_size):
            chunk = requests[i:i + self.batch_size]
            images = []
            for r in chunk:  # each prompt's images, in order (none, one or several)
                opened = []
                for path in r.image_paths:
                    with Image.open(path) as im:
                        opened.append(im.convert("RGB"))
                images.append(opened)
            t0 = time.perf_counter()
            batch = self.processor.encode_prompts([r.question for r in chunk], images)
            c = sample(self.model, self.processor, batch, s)
            latency = (time.perf_counter() - t0) / len(chunk)
            prompt_tokens = batch["attention_mask"].sum(dim=1).tolist()
            for j, r in enumerate(chunk):
                n = int(c.completion_mask[j].sum())
                ended = bool(torch.isin(c.sequences[j, c.prompt_len:][:n], stops).any())
                on_outcome(TeacherAnswer(r.key, c.texts[j], latency, int(prompt_tokens[j]), n,
                                         "stop" if ended else "length"))


@dataclass
class VLLMTeacher:
    """vLLM's offline engine (extra `gpu`; the CPU build serves text-only models); imported only when used.

    The engine starts at the first `run`, sized for it: `max_model_len` (prompt with its images + max_tokens) and,
    for a vision-language model, as many images per prompt as the most any of those requests holds."""
    name: str
    model_path: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    revision: str = ""
    engine_kwargs: dict = field(default_factory=dict)
    seed: int = 0
    llm: object = None  # an engine already serving these weights, shared instead of starting a second one
    max_model_len: int = 8192
    images_per_prompt: int | None = None  # the engine's image limit once started (None: text only)

    def __post_init__(self) -> None:
        from protege.generation.vllm_backend import require_vllm

        require_vllm()
        if not self.revision:  # the weights' hash, not the path: retrained weights at one path are asked anew
            self.revision = weights_digest(self.model_path)

    def _engine(self, requests: list[TeacherRequest]):
        most = max((len(r.image_paths) for r in requests), default=0)
        if self.llm is None:
            from protege.generation.vllm_backend import start_engine

            try:
                config = json.loads((Path(self.model_path) / "config.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                config = {}
            self.images_per_prompt = most if "vision_config" in config else None
            self.llm = start_engine(self.model_path, seed=self.seed, max_model_len=self.max_model_len,
                                    images_per_prompt=self.images_per_prompt, **self.engine_kwargs)
        elif self.images_per_prompt is not None and most > self.images_per_prompt:
            raise UserFacingError(f"teacher '{self.name}': a request holds {most} images, but its vLLM engine was "
                                  f"started for at most {self.images_per_prompt} per prompt")
        return self.llm

    def run(self, requests: list[TeacherRequest], on_outcome: Callable[[Outcome], None]) -> None:
        from PIL import Image
        from vllm import SamplingParams as VSampling

        params = VSampling(temperature=self.sampling.temperature, top_p=self.sampling.top_p,
                           max_tokens=self.sampling.max_tokens)
        prompts = []
        for r in requests:
            content = []
            for path in r.image_paths:
                with Image.open(path) as im:
                    content.append({"type": "image_pil", "image_pil": im.convert("RGB")})
            content.append({"type": "text", "text": r.question})
            prompts.append({"prompt": [{"role": "user", "content": content}]})
        t0 = time.perf_counter()
        outputs = self._engine(requests).chat([p["prompt"] for p in prompts], params)
        latency = (time.perf_counter() - t0) / max(1, len(requests))
        for r, out in zip(requests, outputs):
            o = out.outputs[0]
            on_outcome(TeacherAnswer(r.key, o.text.strip(), latency, len(out.prompt_token_ids or []),
                                     len(o.token_ids), "length" if o.finish_reason == "length" else "stop"))
