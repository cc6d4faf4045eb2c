"""A small OpenAI-compatible chat-completions server for loopback use: tests, benchmarks, dry runs.

It answers every request after a fixed latency with a deterministic text, and can be told to fail:
`fail_first` requests get HTTP 500 before it recovers, or after `fail_after` successes it fails for good.
With `--judge` it acts as an LLM judge: it reads the ground truth and the response out of the LLM judge's
prompt (`protege.rewards.llm_judge.PROMPT`) and answers "yes" or "no" by the rule-based judge, with the
question's candidate answers looked up in `--judge-rows` tables (parquet with question, answer,
candidates) when given. It never runs a model; point the `openai` backend at a real server for real answers.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ServerBehaviour:
    latency_s: float = 0.0
    fail_first: int = 0
    fail_after: int | None = None
    status_on_failure: int = 500
    reply: object = None  # optional callable(prompt text) -> answer text (e.g. a judge's verdict)
    counts: dict = field(default_factory=lambda: {"requests": 0, "answered": 0, "failed": 0})


_JUDGE_PROMPT = re.compile(r"Question: (?P<question>.*?)\nGround-truth answer: (?P<reference>.*?)\n.*?"
                           r"<<<RESPONSE\n(?P<response>.*)\nRESPONSE>>>", re.S)


def rule_verdicts(tables: list[str] = ()):
    """A `reply` for ServerBehaviour: grades the LLM judge's prompt with the rule-based judge.

    Candidates come from the tables' rows with the same question and answer; without them an option
    letter is read among A-J, a number as the response's last number, and any other answer must be the
    whole response (case and punctuation aside).
    """
    import pandas as pd

    from protege.rewards.judge import rule_judge

    known: dict[tuple[str, str], list[str]] = {}
    for table in tables:
        df = pd.read_parquet(table, columns=["question", "answer", "candidates"])
        for q, a, c in zip(df["question"], df["answer"], df["candidates"]):
            known[(q, a)] = json.loads(c or "[]")

    def reply(prompt: str) -> str:
        m = _JUDGE_PROMPT.search(prompt)
        if m is None:
            return "I can only grade the LLM judge's prompt."
        q, ref, resp = m["question"], m["reference"], m["response"]
        cands = known.get((q, ref))
        if cands is None:
            cands = list("ABCDEFGHIJ") if re.fullmatch(r"[A-J]", ref) else None
        return "yes" if rule_judge(ref, resp, cands) else "no"

    return reply


def make_app(b: ServerBehaviour):
    from aiohttp import web

    async def chat(request: "web.Request") -> "web.Response":
        b.counts["requests"] += 1
        n = b.counts["requests"]
        body = await request.json()
        await asyncio.sleep(b.latency_s)
        if n <= b.fail_first or (b.fail_after is not None and b.counts["answered"] >= b.fail_after):
            b.counts["failed"] += 1
            return web.json_response({"error": {"message": "injected failure"}}, status=b.status_on_failure)
        b.counts["answered"] += 1
        text = next(p["text"] for p in body["messages"][-1]["content"] if p.get("type") == "text")
        digest = hashlib.sha256(repr((text, body.get("temperature"))).encode()).hexdigest()[:6]
        answer = b.reply(text) if b.reply else f"Looking closely, my answer is {digest}."
        return web.json_response({
            "id": f"chatcmpl-{n}", "object": "chat.completion", "model": body.get("model", "loopback"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(text.split()), "completion_tokens": len(answer.split())}})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@contextmanager
def serve_in_thread(behaviour: ServerBehaviour, host: str = "127.0.0.1"):
    """Runs the server on a free loopback port in a background thread; yields its base URL (…/v1)."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict = {}

    async def start() -> None:
        runner = web.AppRunner(make_app(behaviour), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://{host}:{holder['port']}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def main() -> None:
    from aiohttp import web

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--fail-after", type=int, default=None)
    ap.add_argument("--judge", action="store_true", help="grade LLM-judge prompts with the rule-based judge")
    ap.add_argument("--judge-rows", nargs="*", default=[], help="parquet tables (question, answer, candidates) "
                                                                "whose candidates the judge reads answers among")
    args = ap.parse_args()
    b = ServerBehaviour(args.latency, args.fail_first, args.fail_after,
                        reply=rule_verdicts(args.judge_rows) if args.judge else None)
    web.run_app(make_app(b), host=args.host, port=args.port, access_log=None, print=lambda *a: None)


if __name__ == "__main__":
    main()
