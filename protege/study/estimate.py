"""How long a study's pending runs will take, printed before the first one starts and again as runs finish.

A run's cost is taken as proportional to its RL work, steps x rollouts per step (questions x samples, or
layouts x plays). The rate (seconds per unit of work) comes, in order of preference, from the finished runs
of the same study part, from finished runs of the same task anywhere in the file, or from the project's own
RL stage (reports/stages/<stage>.json records its seconds, dvc.lock the params it ran with, from which its work;
a record of another game or output length is not used). An evaluation-only run
(`train: false`) costs what finished evaluation-only runs cost, or a twentieth of a trained run's estimate.
With `jobs` runs at once the wall time is the sum over the jobs' shares, longest runs first.

A study's own warm starts (`warm_start_seeds`) are trained one after another before the first run starts:
each costs what the project's own stages of that recipe took (a qa warm start: sft, curate, teachers,
rollouts and disc_pretrain), from `seconds` in reports/stages/<stage>.json, else the time the pipeline
recorded for the stage, else dvc.yaml's `meta.seconds` hint.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from protege.config import Config
from protege.paths import STAGE_METRICS

RL_STAGE = {"qa": "rl", "agent": "agent_rl", "tool": "tool_rl"}
EVAL_ONLY_SHARE = 0.05


def work(cfg: Config, task: str) -> float:
    """Rollouts the run's RL plays: steps x units per step."""
    if task == "qa":
        c = cfg.rl
        return float(c.steps * c.questions_per_step * c.group_size)
    c = getattr(cfg, task).rl
    return float(c.steps * c.seeds_per_step * c.group_size)


@dataclass(frozen=True)
class Finished:
    task: str
    part: str | None
    train: bool
    seconds: float
    work: float


def cost_shape(cfg: Config, task: str) -> object:
    """What makes one rollout of a task cost what it does beyond the work count: the game (its section), how
    much of the conversation each turn sees, and how long an output may be."""
    if task == "qa":
        return cfg.rl.max_new_tokens
    section = getattr(cfg, task)
    game = section.task.model_dump() if task == "tool" else {"env": section.env, section.env:
                                                               getattr(section, section.env).model_dump()}
    return game, getattr(section, "context", None), section.rl.max_new_tokens


def ran_with(project: Path, stage: str, params: Config) -> Config | None:
    """The params the project's `stage` last ran with under dvc: params.yaml's, overlaid with what dvc.lock
    recorded for the stage. None when dvc.lock has no record of it or the record no longer reads as a config."""
    try:
        from protege.dvc_lockfile import parse_dvc_file, read_dvc_lock

        recorded = parse_dvc_file(read_dvc_lock(project) or "")["stages"][stage]["params"]["params.yaml"]
        tree = params.model_dump()
        for key, value in recorded.items():
            *path, last = str(key).split(".")
            node = tree
            for part in path:
                node = node[part]
            node[last] = value
        return Config.model_validate(tree)
    # no usable record (pydantic's validation errors are ValueErrors): the caller uses params.yaml as it is
    except (OSError, KeyError, TypeError, AttributeError, ValueError, yaml.YAMLError):
        return None


def stage_rate(project: Path, task: str, params: Config, like: Config | None = None) -> float | None:
    """Seconds per unit of work of the project's own RL stage for this task, or None when it left no record or
    its record is of another game or output length than `like` (the runs' config; default params.yaml's) plays
    (dvc.lock says what it ran with): a grid game's seconds say nothing about a card game's. The work is counted
    with the params the stage ran with."""
    try:
        seconds = float(json.loads((project / STAGE_METRICS / f"{RL_STAGE[task]}.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ran = ran_with(project, RL_STAGE[task], params)
    if cost_shape(ran or params, task) != cost_shape(like or params, task):
        return None
    units = work(ran or params, task)
    return seconds / units if units > 0 and seconds > 0 else None


def warm_start_seconds(project: Path, stages: tuple[str, ...]) -> float | None:
    """One warm start's estimate: the sum of what the project's own `stages` took, or None when a stage left
    no record and has no hint."""
    try:
        from protege.pipeline import expected_seconds

        known = expected_seconds(project)
    except (OSError, ValueError, AttributeError, TypeError):
        known = {}
    total = 0.0
    for stage in stages:
        try:
            seconds = float(json.loads((project / STAGE_METRICS / f"{stage}.json").read_text())["seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            seconds = known.get(stage)
        if seconds is None:
            return None
        total += seconds
    return total


def run_seconds(task: str, part: str | None, train: bool, units: float, finished: list[Finished],
                prior_rate: float | None) -> float | None:
    """One pending run's estimate, or None when nothing measured can stand for it."""
    def rate(rows: list[Finished]) -> float | None:
        rates = [f.seconds / f.work for f in rows if f.train and f.work > 0]
        return statistics.median(rates) if rates else None

    same_part = [f for f in finished if f.task == task and f.part == part]
    same_task = [f for f in finished if f.task == task]
    if not train:
        evals = [f.seconds for f in (same_part or same_task) if not f.train]
        if evals:
            return statistics.median(evals)
    r = rate(same_part) or rate(same_task) or prior_rate
    if r is None:
        return None
    return r * units if train else EVAL_ONLY_SHARE * r * units


def wall_seconds(estimates: list[float], jobs: int) -> float:
    """Longest first onto whichever of `jobs` lanes frees first: the queue's wall time."""
    lanes = [0.0] * max(1, jobs)
    for s in sorted(estimates, reverse=True):
        lanes[lanes.index(min(lanes))] += s
    return max(lanes)


def describe(pending: list[float | None], jobs: int, finished: int, warm: list[float | None] = ()) -> str:
    """One line: how many runs (and warm starts to train first), the expected wall time, what it rests on."""
    known = [s for s in pending if s is not None]
    warm_known = [s for s in warm if s is not None]
    head = f"{len(pending)} run(s) to do, {finished} finished earlier, {jobs} at a time"
    if warm:
        head += f", after {len(warm)} warm start(s) to train"
    if not pending and not warm:
        return head
    if not known and not warm_known:
        return head + ": no time estimate yet (no finished run and no recorded RL stage to scale from)"
    line = f"{head}: expected about {minutes(sum(warm_known) + (wall_seconds(known, jobs) if known else 0.0))}"
    if warm_known:
        line += f" ({minutes(sum(warm_known))} of it warm starts)"
    left_out = []
    if len(known) < len(pending):
        left_out.append(f"the {len(known)} run(s) with an estimate")
    if len(warm_known) < len(warm):
        left_out.append(f"the {len(warm_known)} warm start(s) with an estimate")
    if left_out:
        line += " for " + " and ".join(left_out)
    return line


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
