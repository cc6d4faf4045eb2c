"""What lmms-eval 0.7.3 does to a generated response before a task's scoring rule sees it.

Every task we score under protocol `lmms-eval` is a `generate_until` task, and the harness runs the
same chain on each response (`evaluator.evaluate`, then `ConfigurableTask.process_results`):

1. the task's filter chain on the raw text: `take_first` for every task but AI2D, whose
   `flexible-extract` chain is one `MultiChoiceRegexFilter` (`ai2d_filter`);
2. the reasoning blocks removed (`api/reasoning.strip_reasoning_tags` with the command line's default
   `--reasoning_tags`, <think>...</think> and <analysis>...</analysis>), which also strips whitespace;
3. `str.strip()` of what reaches `process_results` (a missing response reads as "").

The scorers in `lmms_choice`, `lmms_mathvista`, `circular` and `mmvet` apply this first, so a rule
that looks at "B\\n" or " 12 " sees what lmms-eval's task function sees: "B", "12".
"""
from __future__ import annotations

import re
from collections.abc import Callable

# lmms-eval's `--reasoning_tags` default (lmms_eval/__main__.py); no task we score overrides it.
REASONING_TAGS = (("<think>", "</think>"), ("<analysis>", "</analysis>"))

TaskFilter = Callable[[str], str]


def drop_reasoning(text: str, tags: tuple[tuple[str, str], ...] = REASONING_TAGS) -> str:
    """`strip_reasoning_tags`, from its rules: per tag pair, remove the first opening tag through the
    next closing tag after it, while both tags occur and such a closing tag exists; then, when a closing
    tag is left without any opening tag, keep only what follows its last occurrence (a chat template
    may prefill the opening tag). Tags are case-sensitive; the result is stripped."""
    for start_tag, end_tag in tags:
        text = _drop_blocks(text, start_tag, end_tag)
        if end_tag in text and start_tag not in text:
            text = text.rsplit(end_tag, 1)[-1]
    return text.strip()


def _drop_blocks(text: str, start_tag: str, end_tag: str) -> str:
    while start_tag in text and end_tag in text:
        start = text.find(start_tag)
        end = text.find(end_tag, start)
        if end < 0:  # the only closing tags come before the opening one: lmms-eval stops here
            break
        text = text[:start] + text[end + len(end_tag):]
    return text


_AI2D_LEADING_LETTER = re.compile(r"^\s*([A-Z])\.")


def ai2d_filter(text: str) -> str:
    """AI2D's `MultiChoiceRegexFilter.apply` (the yaml's regex_pattern and flags are never used by it):
    the capital letter of a leading "X." after optional whitespace, else the response unchanged. The
    same chain serves every AI2D task of 0.7.3 (ai2d, ai2d_lite, ai2d_no_mask) and every prompt variant."""
    m = _AI2D_LEADING_LETTER.match(text)
    return m.group(1) if m else text


def lmms_response(raw: str | None, task_filter: TaskFilter | None = None) -> str:
    """The response as the task's scoring function receives it (steps 1-3 above)."""
    text = raw if isinstance(raw, str) else ""
    if task_filter is not None:
        text = task_filter(text)
    return drop_reasoning(text).strip()
