"""A teacher behind any OpenAI-compatible chat-completions server (vLLM serve, TGI, hosted APIs).

Async with a concurrency limit, a per-request timeout, and retries on 429, 5xx, timeouts and dropped
connections: after a 429 or 503 that carries `Retry-After` (seconds or an HTTP date) it waits what the server
asked for, at most `retry_after_cap_s`; otherwise exponential backoff with jitter, at most `backoff_cap_s`.
Other 4xx answers are the caller's mistake: no retry. A request that fails for good says its URL, the last
status or error and how many attempts it made.
The answer is read by `reply_text` from the reply shapes such servers send; a reply without answer text
is a failure that says which field was empty (`EmptyReply`), never an empty answer.
"""
from __future__ import annotations

import asyncio
import base64
import email.utils
import functools
import math
import mimetypes
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timezone
from pathlib import Path

from protege.teachers.backends import Outcome, SamplingParams, TeacherAnswer, TeacherFailure, TeacherRequest

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
RETRY_AFTER_STATUS = {429, 503}  # where a server's Retry-After says when it will take the request


class _Retryable(Exception):
    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after_s(value: str | None, now: float) -> float | None:
    """The wait a `Retry-After` header asks for, in seconds: delta-seconds or an HTTP date (a date already
    past is no wait); None when the header is absent or unreadable, so the caller falls back to backoff."""
    if not value or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # HTTP dates are GMT; an obsolete form without a zone is too
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


class EmptyReply(ValueError):
    """A well-formed reply that carries no answer text; the message names the field that was empty.
    `truncated`: the token limit ran out before any answer text (a setting to raise, not a blank reply)."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


# Where OpenAI-compatible servers put the answer. `content` is a string in OpenAI's own API, but
# servers also send a list of parts ([{"type": "text", "text": ...}], the shape of multimodal input,
# or {"text": {"value": ...}}), null next to a refusal or reasoning, or the legacy completions `text`.
_TEXT_PART_TYPES = {None, "text", "output_text"}
_REASONING_FIELDS = ("reasoning_content", "reasoning")


def _part_text(part) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES:
        return ""  # an image, audio or refusal part is not answer text
    text = part.get("text")
    if isinstance(text, dict):
        text = text.get("value")
    return text if isinstance(text, str) else ""


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p) for p in content)
    return ""


def _describe_empty(choice: dict, message: dict, field: str) -> str:
    """Why a reply has no text, in terms the person running the judge can act on."""
    content = message.get("content")
    shape = ("null" if content is None else "a list with no text parts" if isinstance(content, list)
             else "blank" if isinstance(content, str) else f"a {type(content).__name__}")
    finish = choice.get("finish_reason")
    parts = [f"empty reply: choices[0].{field}.content is {shape} (finish_reason {finish!r})"]
    if message.get("refusal"):
        parts.append(f"the model refused: {str(message['refusal'])[:120]!r}")
    reasoning = next((f for f in _REASONING_FIELDS if message.get(f)), None)
    if reasoning:
        parts.append(f"only choices[0].{field}.{reasoning} has text ({len(str(message[reasoning]))} characters)")
        if finish == "length":
            parts.append("the token limit ran out while the model was reasoning: raise max_tokens")
    return "; ".join(parts)


def reply_text(body: dict) -> str:
    """The answer text of a chat-completions reply: `choices[0].message.content` as a string or as text
    parts, else the legacy `choices[0].text`. Reasoning fields are never the answer. EmptyReply when
    there is no text, ValueError / KeyError / IndexError for a body that is not a chat completion."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"no choices[0] in the reply: {str(body)[:200]}")
    choice = choices[0]
    field = "message" if isinstance(choice.get("message"), dict) else "delta"
    message = choice.get(field) if isinstance(choice.get(field), dict) else {}
    text = _content_text(message.get("content"))
    if not text.strip() and isinstance(choice.get("text"), str):
        text = choice["text"]
    if not text.strip():
        raise EmptyReply(_describe_empty(choice, message, field), truncated=choice.get("finish_reason") == "length")
    return text


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
    # a server may ask for minutes; past this we try again sooner and let it answer 429 again, which costs
    # one of the max_retries attempts rather than leaving a stage waiting on one header
    retry_after_cap_s: float = 60.0
    revision: str = ""
    seed: int = 0
    # injectable so tests can check the waits without spending them
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)

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

    def wait_before_retry(self, attempt: int, asked_s: float | None) -> float:
        """What the server asked for (capped) when it said, else backoff. Up to 10% is added to an asked
        wait: requests turned away together would otherwise all come back in the same instant."""
        if asked_s is None:
            return self.backoff(attempt)
        return min(asked_s, self.retry_after_cap_s) * (1.0 + 0.1 * self._rng.random())

    async def _one(self, session, r: TeacherRequest) -> Outcome:
        import aiohttp

        url = self.base_url.rstrip("/") + "/chat/completions"
        payload = self._payload(r)
        attempts = self.max_retries + 1
        last_error, wait = "", 0.0
        for attempt in range(attempts):
            if attempt:
                await self.sleep(wait)
            t0 = time.perf_counter()
            try:
                self.requests_sent += 1
                async with session.post(url, json=payload, headers=self._headers(),
                                        timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                    if resp.status in RETRY_STATUS:
                        header = resp.headers.get("Retry-After") if resp.status in RETRY_AFTER_STATUS else None
                        asked = retry_after_s(header, self.clock())
                        raise _Retryable(f"HTTP {resp.status}" + (f" (Retry-After: {header})" if header else ""),
                                         asked)
                    if resp.status >= 400:
                        return TeacherFailure(r.key, f"HTTP {resp.status} from {url}, not retried: "
                                                     f"{(await resp.text())[:200]}", attempt + 1)
                    body = await resp.json()
                text = reply_text(body)
                choice = body["choices"][0]
                usage = body.get("usage") or {}
                return TeacherAnswer(r.key, text.strip(), time.perf_counter() - t0,
                                     int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                                     "length" if choice.get("finish_reason") == "length" else "stop")
            except _Retryable as exc:
                last_error, wait = str(exc), self.wait_before_retry(attempt, exc.retry_after_s)
            except (asyncio.TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                last_error, wait = str(exc) or type(exc).__name__, self.backoff(attempt)
            except EmptyReply as exc:
                # the same request at temperature 0 would come back empty again: report it, do not retry
                return TeacherFailure(r.key, str(exc), attempt + 1, "truncated" if exc.truncated else "empty")
            except (KeyError, IndexError, ValueError, aiohttp.ContentTypeError) as exc:
                return TeacherFailure(r.key, f"malformed response: {exc!r}", attempt + 1)
        return TeacherFailure(r.key, f"{last_error} from {url}; gave up after {attempts} attempt(s)", attempts)

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
