"""The API teacher and the LLM judge honour a server's Retry-After (seconds or an HTTP date), capped; without
one they back off exponentially with jitter; a request that fails for good names its URL, the status and the
attempts. A local aiohttp server answers; the waits go to an injected sleep, so nothing really waits."""
from __future__ import annotations

import asyncio
import email.utils
import threading
from contextlib import contextmanager

import pytest

from protege.rewards.llm_judge import JudgeUnavailable, LLMJudge
from protege.teachers.backends import SamplingParams, TeacherAnswer, TeacherFailure, TeacherRequest
from protege.teachers.openai_backend import OpenAITeacher, retry_after_s

NOW = 1_800_000_000.0  # the injected clock's time


def reply(text: str) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


@contextmanager
def serving(answers: list):
    """A chat-completions server on a free loopback port that gives `answers` in order, each (status, headers)
    or a text to answer with 200; the last one repeats. Yields (base URL, the count of requests received)."""
    from aiohttp import web

    seen = {"requests": 0}

    async def chat(request):
        await request.json()
        answer = answers[min(seen["requests"], len(answers) - 1)]
        seen["requests"] += 1
        if isinstance(answer, str):
            return web.json_response(reply(answer))
        status, headers = answer
        return web.json_response({"error": {"message": "busy"}}, status=status, headers=headers)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    loop, ready, holder = asyncio.new_event_loop(), threading.Event(), {}

    async def start():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"], holder["port"] = runner, site._server.sockets[0].getsockname()[1]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{holder['port']}/v1", seen
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def teacher(url: str, waits: list[float], **kw) -> OpenAITeacher:
    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    return OpenAITeacher("remote", url, "m", SamplingParams(max_tokens=4), api_key_env=None, timeout_s=10,
                         sleep=sleep, clock=lambda: NOW, **kw)


def ask(t: OpenAITeacher, n: int = 1) -> list:
    got: list = []
    t.run([TeacherRequest(f"k{i}", f"q{i}", f"question {i}") for i in range(n)], got.append)
    return got


def http_date(at: float) -> str:
    return email.utils.formatdate(at, usegmt=True)


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s("120", NOW) == 120.0 and retry_after_s(" 0 ", NOW) == 0.0
    assert retry_after_s(http_date(NOW + 30), NOW) == pytest.approx(30.0)
    assert retry_after_s(http_date(NOW - 30), NOW) == 0.0  # a date already past: no wait
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00", NOW) == 0.0  # no zone: GMT, long past
    for unreadable in (None, "", "soon", "nan", "inf"):
        assert retry_after_s(unreadable, NOW) is None


def test_429_with_retry_after_seconds_waits_that_long_then_succeeds():
    waits: list[float] = []
    with serving([(429, {"Retry-After": "7"}), "fine"]) as (url, seen):
        t = teacher(url, waits, max_retries=3)
        (outcome,) = ask(t)
    assert isinstance(outcome, TeacherAnswer) and outcome.text == "fine"
    assert seen["requests"] == 2 and t.requests_sent == 2
    assert len(waits) == 1 and 7.0 <= waits[0] <= 7.7  # what the server asked, plus at most 10% spread


def test_503_with_an_http_date_waits_until_then():
    waits: list[float] = []
    with serving([(503, {"Retry-After": http_date(NOW + 20)}), "fine"]) as (url, _):
        (outcome,) = ask(teacher(url, waits))
    assert isinstance(outcome, TeacherAnswer)
    assert len(waits) == 1 and 20.0 <= waits[0] <= 22.0


def test_a_long_retry_after_is_capped():
    waits: list[float] = []
    with serving([(429, {"Retry-After": "3600"}), "fine"]) as (url, _):
        (outcome,) = ask(teacher(url, waits, retry_after_cap_s=60.0))
    assert isinstance(outcome, TeacherAnswer)
    assert len(waits) == 1 and 60.0 <= waits[0] <= 66.0


def test_without_retry_after_it_backs_off_exponentially_capped():
    waits: list[float] = []
    # a 500's Retry-After is not a promise to honour (only 429 and 503's are): backoff, like no header at all
    answers = [(429, {}), (500, {"Retry-After": "40"}), (502, {}), (503, {"Retry-After": "soon"}), "fine"]
    with serving(answers) as (url, _):
        (outcome,) = ask(teacher(url, waits, max_retries=5, backoff_base_s=1.0, backoff_cap_s=4.0))
    assert isinstance(outcome, TeacherAnswer)
    assert len(waits) == 4
    for attempt, wait in enumerate(waits):
        assert 0.5 * min(4.0, 2 ** attempt) <= wait < 1.5 * min(4.0, 2 ** attempt)


def test_giving_up_names_the_url_the_status_and_the_attempts():
    waits: list[float] = []
    with serving([(429, {"Retry-After": "2"})]) as (url, seen):
        (outcome,) = ask(teacher(url, waits, max_retries=2))
    assert isinstance(outcome, TeacherFailure) and outcome.attempts == 3 and seen["requests"] == 3
    assert f"{url}/chat/completions" in outcome.error and "HTTP 429" in outcome.error
    assert "3 attempt(s)" in outcome.error and "Retry-After: 2" in outcome.error
    assert len(waits) == 2 and all(2.0 <= w <= 2.2 for w in waits)


def test_a_client_error_is_not_retried_and_says_where():
    waits: list[float] = []
    with serving([(400, {"Retry-After": "5"})]) as (url, seen):
        (outcome,) = ask(teacher(url, waits, max_retries=4))
    assert isinstance(outcome, TeacherFailure) and outcome.attempts == 1 and seen["requests"] == 1 and not waits
    assert "HTTP 400" in outcome.error and url in outcome.error


def test_the_judge_waits_out_a_429_then_grades(tmp_path):
    waits: list[float] = []
    with serving([(429, {"Retry-After": "3"}), "yes"]) as (url, seen):
        judge = LLMJudge(teacher(url, waits), tmp_path / "verdicts.jsonl")
        assert judge(["How many?"], ["3"], ["It is 3."]) == [1.0]
    assert seen["requests"] == 2 and judge.unparsable == 0
    assert len(waits) == 1 and 3.0 <= waits[0] <= 3.3


def test_an_unreachable_judge_stops_with_the_reason_not_a_no(tmp_path):
    """A judge that never answers would otherwise score every response "no" (unparsable): a silent zero reward."""
    waits: list[float] = []
    with serving(["yes", (503, {"Retry-After": "1"})]) as (url, seen):
        judge = LLMJudge(teacher(url, waits, max_retries=2, concurrency=1), tmp_path / "verdicts.jsonl")
        with pytest.raises(JudgeUnavailable) as err:
            judge(["Q1", "Q2"], ["1", "2"], ["1", "2"])
    message = str(err.value)
    assert "1 of 2 prompt(s) got no answer" in message and "HTTP 503" in message
    assert "3 attempt(s)" in message and f"{url}/chat/completions" in message
    assert seen["requests"] == 1 + 3 and judge.unparsable == 0
    # the verdict received is kept: asking again starts from it
    assert len((tmp_path / "verdicts.jsonl").read_text().splitlines()) == 1
