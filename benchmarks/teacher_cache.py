"""Teacher-cache throughput against an OpenAI-compatible server on loopback.

Starts the loopback server in its own process with a fixed per-request latency, fills an empty cache
with N requests at concurrency C through the `openai` backend, and prints achieved requests/s against
the bound C / latency. Then fills again and prints how many requests the second run made (expect 0).

    .venv/bin/python benchmarks/teacher_cache.py [--requests 2000] [--concurrency 32] [--latency 0.2]
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from protege.teachers.backends import SamplingParams, TeacherRequest
from protege.teachers.cache import TeacherCache, cache_key, file_sha256
from protege.teachers.openai_backend import OpenAITeacher


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port: int, timeout: float = 30.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"loopback server did not start on port {port}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.2, help="server seconds per request")
    args = ap.parse_args()

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "protege.loopback_server", "--port", str(port),
                               "--latency", str(args.latency)])
    try:
        wait_for(port)
        with tempfile.TemporaryDirectory() as tmp:
            image = Path(tmp) / "image.png"
            Image.new("RGB", (64, 64), (200, 30, 30)).save(image)
            sampling = SamplingParams(temperature=1.0, max_tokens=64)
            reqs = [TeacherRequest(cache_key("bench", "loopback", f"question {i}", file_sha256(image),
                                             sampling.as_dict(), 0), f"q{i}", f"question {i}", str(image))
                    for i in range(args.requests)]
            cache = TeacherCache(Path(tmp) / "cache")
            bound = args.concurrency / args.latency
            for attempt in ("first fill", "second fill"):
                teacher = OpenAITeacher("bench", f"http://127.0.0.1:{port}/v1", "loopback", sampling, api_key_env=None,
                                        concurrency=args.concurrency, timeout_s=30, revision="loopback")
                t0 = time.perf_counter()
                stats = cache.fill(teacher, reqs)
                seconds = time.perf_counter() - t0
                if attempt == "first fill":
                    rate = stats["received"] / seconds
                    print(f"{attempt}: {stats['received']} answers in {seconds:.2f} s = {rate:.1f} requests/s; "
                          f"bound {args.concurrency}/{args.latency} s = {bound:.1f} requests/s -> "
                          f"{100 * rate / bound:.1f}% of bound (target >= 90%)")
                    print(f"  latency p50 {stats['p50_latency_s']:.3f} s, p95 {stats['p95_latency_s']:.3f} s; "
                          f"HTTP requests {teacher.requests_sent}")
                else:
                    print(f"{attempt}: {teacher.requests_sent} requests made ({stats['cached_before']} answers "
                          f"already cached) in {seconds:.2f} s")
            print(f"cache rows: {len(cache.load('bench'))} (unique keys: {cache.load('bench')['key'].nunique()})")
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
