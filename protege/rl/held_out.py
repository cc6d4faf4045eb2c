"""The held-out curve of multi-turn RL: every `rl.eval_every` steps (and at the last step) the policy and, under
GTR-Turbo, the merged teacher as it stands after that step's merge play the first `rl.eval_episodes` held-out
layouts (eval seeds, the final evaluation's first ones) greedily: `eval_success` and `teacher_eval_success`,
so a study can see whether the teacher leads the policy for part of the run. Several processes each play
their share of the layouts and the step's figures are averaged over them (exact when the count divides)."""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from protege.eval.agent import greedy_successes
from protege.rl.guidance.base import Guidance
from protege.rl.guidance.merged_teacher import MergedTeacherGuidance
from protege.runtime.distributed import world
from protege.runtime.placement import visiting


def held_out_point(policy: torch.nn.Module, guidance: list[Guidance], processor, cfg, image_size: int,
                   device: torch.device, gathered: Callable[[], AbstractContextManager]) -> dict[str, float]:
    """This step's point of the curve. `cfg`: the game's section (agent or tool); `gathered`: the updater's
    context that holds the policy's weights whole (ZeRO-3)."""
    t0 = time.perf_counter()
    share, n = world(), cfg.rl.eval_episodes
    out: dict[str, float] = {}
    with gathered():
        solved, played = greedy_successes(policy, processor, cfg, image_size, n, device, share)
    if played:
        out["eval_success"] = solved / played
    merged = next((t for t in guidance if isinstance(t, MergedTeacherGuidance)), None)
    if merged is not None:
        with visiting(merged.teacher, device, merged.offload):
            solved, played = greedy_successes(merged.teacher, processor, cfg, image_size, n, device, share)
        if played:
            out["teacher_eval_success"] = solved / played
    out["eval_s"] = time.perf_counter() - t0
    return out
