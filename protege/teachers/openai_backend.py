"""A teacher behind any OpenAI-compatible chat-completions server (vLLM serve, TGI, hosted APIs).

Async with a concurrency limit, a per-request timeout, and retries with exponential backoff and jitter
on 429, 5xx, timeouts and dropped connections. Other 4xx answers are the caller's mistake: no retry.
"""
from __future__ import annotations

import asyncio
import base64
import functools
import mimetypes
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from protege.teachers.backends import Outcome, SamplingParams, TeacherAnswer, TeacherFailure, TeacherRequest

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class _Retryable(Exception):
    pass


@functools.lru_cache(maxsize=256)  # many requests share an image (N samples per question)
def image_data_url(path: str | Path) -> str:
    mime = mimetypes.guess_type(str(path))[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


@dataclass
class OpenAITeacher:
    name: str
    base_url: str                      # e.g. http://127.0.0.1:8000/v1
    model: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    api_key_env: str | None = "OPENAI_API_KEY"
    concurrency: int = 32
    timeout_s: float = 60.0
    max_retries: int = 5
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    revision: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        self.revision = self.revision or self.model
        self.requests_sent = 0         # HTTP requests made, retries included (benchmarks read it)
        self._rng = random.Random(self.seed)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _payload(self, r: TeacherRequest) -> dict:
        content: list[dict] = []
        for path in r.image_paths:  # several images of one question travel in order
            content.append({"type": "image_url", "image_url": {"url": image_data_url(path)}})
        content.append({"type": "text", "text": r.question})
        return {"model": self.model, "messages": [{"role": "user", "content": content}],
                **self.sampling.as_dict(), "n": 1}

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: uniform in [0.5, 1.5) x base x 2^attempt, capped."""
        return min(self.backoff_cap_s, self.backoff_base_s * 2 ** attempt) * (0.5 + self._rng.random())

    async def _one(self, session, r: TeacherRequest) -> Outcome:
        import aiohttp

        url = self.base_url.rstrip("/") + "/chat/completions"
        payload = self._payload(r)
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff(attempt - 1))
            t0 = time.perf_counter()
            try:
                self.requests_sent += 1
                async with session.post(url, json=payload, headers=self._headers(),
                                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                    if resp.status in RETRY_STATUS:
                        raise _Retryable(f"HTTP {resp.status}")
                    if resp.status >= 400:
                        return TeacherFailure(r.key, f"HTTP {resp.status}: {(await resp.text())[:200]}", attempt + 1)
                    body = await resp.json()
                choice = body["choices"][0]
                usage = body.get("usage") or {}
                return TeacherAnswer(r.key, (choice["message"]["content"] or "").strip(), time.perf_counter() - t0,
                                     int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                                     "length" if choice.get("finish_reason") == "length" else "stop")
            except (_Retryable, asyncio.TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                last_error = str(exc) or type(exc).__name__
            except (KeyError, IndexError, ValueError, aiohttp.ContentTypeError) as exc:
                return TeacherFailure(r.key, f"malformed response: {exc!r}", attempt + 1)
        return TeacherFailure(r.key, f"gave up after {self.max_retries + 1} attempts: {last_error}", self.max_retries + 1)

    async def _run(self, requests: list[TeacherRequest], on_outcome: Callable[[Outcome], None]) -> None:
        import aiohttp

        sem = asyncio.Semaphore(self.concurrency)
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def bounded(r: TeacherRequest) -> None:
                async with sem:
                    outcome = await self._one(session, r)
                # the callback may write a shard: off the event loop, so requests in flight keep moving
                await asyncio.to_thread(on_outcome, outcome)

            await asyncio.gather(*(bounded(r) for r in requests))

    def run(self, requests: list[TeacherRequest], on_outcome: Callable[[Outcome], None]) -> None:
        asyncio.run(self._run(requests, on_outcome))
