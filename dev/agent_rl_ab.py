"""A/B of agent RL settings over RL seeds on one finished demo project's warm start (resumable).

    .venv/bin/python dev/agent_rl_ab.py PROJECT OUT --arm base --arm warmup=agent.rl.ppo.value_warmup_steps:5 \
        --seeds 0 1 2 [--jobs 2]

Each (arm, seed) runs `protege stage agent_rl` in its own copy of PROJECT (the warm start kept, `seed` set, one
thread each) and keeps reports/agent/summary.json; then prints each arm's last RL - warm start per seed and the
mean over seeds with a t interval, and each arm's difference from the first.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from scipy import stats


def set_key(params: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    for k in head:
        params = params[k]
    params[last] = yaml.safe_load(value)


def run(project: Path, out: Path, arm: str, overrides: list[str], seed: int) -> dict:
    work = out / f"{arm}-seed{seed}"
    done = work / "summary.json"
    if done.is_file():
        return json.loads(done.read_text())
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(project, work, ignore=shutil.ignore_patterns(".venv", ".venv-vllm", "agent_rl", "tool_rl", "rl",
                                                                 "rl_baseline", "mlruns", ".git"), symlinks=True)
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["seed"], params["threads"] = seed, 1
    for o in overrides:
        key, value = o.split(":", 1)
        set_key(params, key, value)
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    with open(work / "stage.log", "w") as log:
        subprocess.run([str(project / ".venv" / "bin" / "protege"), "stage", "agent_rl"], cwd=work, check=True,
                       stdout=log, stderr=subprocess.STDOUT)
    shutil.copy(work / "reports" / "agent" / "summary.json", done)
    return json.loads(done.read_text())


def diff(s: dict, key: str) -> float:
    return 100 * (s[key]["success_rate"] - s["start"]["success_rate"])


def interval(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:+.1f}"
    m, se = statistics.mean(values), statistics.stdev(values) / len(values) ** 0.5
    t = stats.t.ppf(0.975, len(values) - 1)
    return f"{m:+.1f} [{m - t * se:+.1f}, {m + t * se:+.1f}] (n={len(values)})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("project", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--arm", action="append", required=True, help="NAME or NAME=KEY:VALUE,KEY:VALUE")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args()
    arms = {x.split("=")[0]: (x.split("=", 1)[1].split(",") if "=" in x else []) for x in a.arm}
    a.out.mkdir(parents=True, exist_ok=True)
    todo = [(arm, o, s) for s in a.seeds for arm, o in arms.items()]
    with ThreadPoolExecutor(a.jobs) as pool:
        results = dict(zip([(arm, s) for arm, _, s in todo],
                           pool.map(lambda t: run(a.project.resolve(), a.out.resolve(), *t), todo)))
    first = next(iter(arms))
    for arm in arms:
        ends = [diff(results[(arm, s)], "end") for s in a.seeds]
        line = f"{arm:10s} last RL - warm start per seed {[round(x, 1) for x in ends]}: {interval(ends)}"
        if arm != first:
            line += f"; - {first}: {interval([e - diff(results[(first, s)], 'end') for e, s in zip(ends, a.seeds)])}"
        print(line, flush=True)
    json.dump({f"{arm}-{s}": r for (arm, s), r in results.items()}, open(a.out / "all.json", "w"))


if __name__ == "__main__":
    sys.exit(main())
