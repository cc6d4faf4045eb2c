"""Two ranks of the real `rl` stage, launched by the stage itself (`rl.processes: 2`, `rl.backend: deepspeed`):
the GPU check's multi-process part (benchmarks/gpu_check.sh, on a machine with two GPUs or more).

Instead of running the pipeline up to rl (world, teachers, SFT, curation: minutes, and DVC), this script
prepares a tiny project folder itself with exactly what `protege stage rl` reads for a dr_grpo run:

  params.yaml            the repository's, with rl set to: dr_grpo, 2 steps x 2 questions x 2 samples, save_every
                         1, no learning curve, no baseline, backend deepspeed, zero_stage Z, processes N,
                         device D (and the world's sizes shrunk)
  data/curated/rl.parquet + images/   the tiny world's rl split (the curated table is self-contained)
  models/sft, models/base             the embedded tiny student (random weights; models/base for the plan)

then runs, in that folder, the very command dvc.yaml runs:

    python -m protege stage rl --params params.yaml

which starts N ranks (protege/runtime/launch.py: each binds its GPU, joins the NCCL group with device_id and
rl.collective_timeout_s), trains, and has rank 0 write reports/stages/rl.json and models/rl/step-*. The part
passes when the report says N processes and both checkpoints exist.

    python benchmarks/gpu_stage.py --processes 2 --device cuda            # two GPUs
    DS_ACCELERATOR=cpu python benchmarks/gpu_stage.py --processes 2 --device cpu   # CPU smoke (gloo)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def prepare(proj: Path, processes: int, device: str, zero: int, steps: int) -> None:
    import yaml

    from protege.config import ModelConfig, WorldConfig
    from protege.models.processor import StudentProcessor
    from protege.models.student import build_student, save_student
    from protege.models.tokenizer import train_tokenizer
    from protege.world.generate import generate_world
    from protege.world.questions import make_item

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["threads"] = 1
    params["world"].update(n_train=16, n_rl=16, n_val=8, n_test=8)
    params["rl"].update(algorithm="dr_grpo", baseline=None, steps=steps, questions_per_step=2, group_size=2,
                        max_new_tokens=6, save_every=1, eval_every=0, backend="deepspeed", zero_stage=zero,
                        processes=processes, device=device, generation="transformers", collective_timeout_s=300)
    proj.mkdir(parents=True, exist_ok=True)
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    world = proj / "data" / "world"
    generate_world(WorldConfig(**params["world"]), world)
    curated = proj / "data" / "curated"
    curated.mkdir(parents=True, exist_ok=True)
    shutil.copy(world / "rl.parquet", curated / "rl.parquet")  # image paths are relative to the table
    shutil.copytree(world / "images" / "rl", curated / "images" / "rl")
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(200)]
    processor = StudentProcessor.create(train_tokenizer([i.question for i in items] + [i.answer for i in items],
                                                        512), 64, 8, 2)
    student = build_student(ModelConfig(), processor, seed=0)
    for rel in ("models/sft", "models/base"):
        save_student(student, processor, proj / rel)


def run_stage(proj: Path, limit: float) -> tuple[int, str, float]:
    env = dict(os.environ)
    # the checkout's protege, whether or not it is installed
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "protege", "stage", "rl", "--params", "params.yaml"], cwd=proj,
                          env=env, capture_output=True, text=True, timeout=limit)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--zero", type=int, choices=[2, 3], default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--limit", type=float, default=300, help="seconds the stage may take")
    ap.add_argument("--keep", help="prepare the project in this folder and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(args.keep) if args.keep else Path(tmp) / "proj"
        t0 = time.perf_counter()
        prepare(proj, args.processes, args.device, args.zero, args.steps)
        prepare_s = time.perf_counter() - t0
        code, log, seconds = run_stage(proj, args.limit)
        report = proj / "reports" / "stages" / "rl.json"
        summary = json.loads(report.read_text()) if report.exists() else {}
        saved = sorted(p.name for p in (proj / "models" / "rl").glob("step-*"))
        launched = next((ln.strip() for ln in log.splitlines() if "processes (" in ln), None)
    out = {"part": "stage", "processes": args.processes, "device": args.device, "zero": args.zero,
           "exit": code, "stage_s": seconds, "prepare_s": prepare_s, "launch_line": launched,
           "reported_processes": summary.get("processes"), "checkpoints": saved,
           "seconds_in_stage": summary.get("seconds")}
    expected = [f"step-{s:05d}" for s in range(1, args.steps + 1)]
    problem = None
    if code != 0:
        problem = f"`protege stage rl` exited {code}"
    elif summary.get("processes") != args.processes:
        problem = f"reports/stages/rl.json says {summary.get('processes')} processes, expected {args.processes}"
    elif saved != expected:
        problem = f"checkpoints {saved}, expected {expected}"
    print(json.dumps(out), flush=True)
    if problem:
        sys.stderr.write(log[-6000:] + "\n")
        print(f"gpu_stage: FAILED: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
