"""Progress of long work over rows: done / total, rows per second and time left, printed at most every few
seconds and handed to a metric callback, so a stage that runs for minutes (or hours with API teachers) is
never silent."""
from __future__ import annotations

import time
from typing import Callable


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h04m."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """`update(n)` after each batch. `say(line)` prints; `metrics(values, step)` (optional) records
    `{what}_done`, `{what}_per_s` and `{what}_left_s`. The first and the last update always report; the others
    at most every `every_s` seconds. `total` None: no time left is known."""

    def __init__(self, what: str, total: int | None, say: Callable[[str], None],
                 metrics: Callable[[dict, int], None] | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.total, self.say, self.metrics, self.every_s = what, total, say, metrics, every_s
        self.clock = clock
        self.start = clock()
        self.last = None
        self.done = 0

    def rate(self) -> float:
        elapsed = self.clock() - self.start
        return self.done / elapsed if elapsed > 0 else 0.0

    def left_s(self) -> float | None:
        rate = self.rate()
        if self.total is None or rate <= 0:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def line(self) -> str:
        of = f"/{self.total:,}" if self.total is not None else ""
        text = f"{self.done:,}{of} {self.what} ({self.rate():,.1f} {self.what}/s"
        left = self.left_s()
        if left is not None and self.done < (self.total or 0):
            text += f", {duration(left)} left"
        elif self.done and self.total is not None and self.done >= self.total:
            text += f", {duration(self.clock() - self.start)} in all"
        return text + ")"

    def reached(self, done: int, total: int | None = None) -> None:
        """`update` for loops that report how far they are (`progress(done, total)` callbacks), not a batch's n."""
        if total is not None:
            self.total = total
        self.update(done - self.done)

    def update(self, n: int) -> None:
        self.done += n
        now = self.clock()
        finished = self.total is not None and self.done >= self.total
        if self.last is not None and not finished and now - self.last < self.every_s:
            return
        self.last = now
        self.say(self.line())
        if self.metrics is not None:
            values = {f"{self.what}_done": float(self.done), f"{self.what}_per_s": self.rate()}
            left = self.left_s()
            if left is not None:
                values[f"{self.what}_left_s"] = left
            self.metrics(values, self.done)
