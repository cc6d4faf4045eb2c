"""The LLM judge of an evaluation: one reply per prompt, and a tally of the replies it could not use.

A judge that gives nothing usable for a prompt (a blank reply, an error after the backend's retries) hands
the scorer "", which is what lmms-eval's `get_chat_response` returns when its GPT gives nothing, so the
item is scored as the harness scores it (MM-Vet 0, MathVista an empty extraction) and the rest goes on.
The tally keeps the last outcome of every prompt of one benchmark; `check_tally` stops the run only when
the judge is evidently misconfigured, or when more replies are unusable than the user allows.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from protege.errors import UserFacingError

# prompts -> (replies by position, (kind, reason) of the failures by position)
AskAll = Callable[[list[str]], tuple[dict[int, str], dict[int, tuple[str, str]]]]


@dataclass
class JudgeTally:
    """The judge's outcomes over one benchmark: prompts asked, and those whose last ask gave nothing usable."""
    prompts: int = 0
    unusable: int = 0
    empty: int = 0                                   # of the unusable: the judge answered with no text
    reasons: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        """'3 of 1,000 judge replies were empty', or '' when every reply was usable."""
        if not self.unusable:
            return ""
        if self.empty == self.unusable:
            return f"{self.unusable:,} of {self.prompts:,} judge replies were empty"
        return (f"{self.unusable:,} of {self.prompts:,} judge replies were unusable "
                f"({self.empty:,} empty, {self.unusable - self.empty:,} failed)")

    def as_dict(self) -> dict:
        return {"prompts": self.prompts, "unusable": self.unusable, "empty": self.empty, "reasons": self.reasons}


class JudgeCompleter:
    """A `Completer` over a judge backend that never raises for one bad reply: "" stands for it, and the
    outcome is kept for `take_tally`."""

    def __init__(self, ask_all: AskAll, who: str, max_unusable: float):
        self._ask_all = ask_all
        self.who = who                   # "evaluate.judge 'gpt' (openai, model 'gpt-4o' at http://...)"
        self.max_unusable = max_unusable
        self._last: dict[str, tuple[str, str] | None] = {}

    def __call__(self, prompts: list[str]) -> list[str]:
        replies, failures = self._ask_all(prompts)
        for i, prompt in enumerate(prompts):
            self._last[prompt] = None if i in replies else failures.get(i, ("error", "no outcome reported"))
        return [replies.get(i, "") for i in range(len(prompts))]

    def take_tally(self) -> JudgeTally:
        """The tally since the last call (one benchmark's prompts), and a fresh start for the next."""
        failed = [f for f in self._last.values() if f is not None]
        tally = JudgeTally(len(self._last), len(failed), sum(kind == "empty" for kind, _ in failed),
                           dict(Counter(reason for _, reason in failed).most_common()))
        self._last = {}
        return tally


def min_prompts_for_share(max_unusable: float) -> int:
    """A share is judged only over enough prompts that one unusable reply can be within it (20 at 5%)."""
    return 1 if max_unusable <= 0 else math.ceil(1 / max_unusable - 1e-9)


def check_tally(tally: JudgeTally, who: str, max_unusable: float, benchmark: str) -> None:
    """Raises, in one line, when the judge gave no usable reply at all and not only blank ones (unreachable,
    refused, cut off by its token limit: a misconfigured judge), or when the share of unusable replies is
    above `max_unusable` over at least `min_prompts_for_share` prompts."""
    if not tally.unusable:
        return
    reasons = list(tally.reasons)
    shown = "; ".join(reasons[:3]) + (f" (and {len(reasons) - 3} other errors)" if len(reasons) > 3 else "")
    if tally.unusable == tally.prompts and tally.empty < tally.unusable:
        raise UserFacingError(f"{who} gave no usable reply to {tally.unusable} of {tally.prompts} prompts "
                              f"({benchmark}): {shown}")
    share = tally.unusable / tally.prompts
    if tally.prompts >= min_prompts_for_share(max_unusable) and share > max_unusable:
        raise UserFacingError(f"{who}: {tally.line()} on {benchmark} ({100 * share:.1f}%, more than "
                              f"evaluate.judge.max_unusable {100 * max_unusable:g}%): {shown}")
