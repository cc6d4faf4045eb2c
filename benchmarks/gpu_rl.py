"""The GPU check's Python half (benchmarks/gpu_check.sh runs it): the tiny world's student trained by the RL
loop with DeepSpeed ZeRO-2 on CUDA, rollouts from vLLM or transformers, and a check that vLLM follows the
policy's weights after a sync. Prints one JSON line per part; exits non-zero, with the reason, on failure.

    python benchmarks/gpu_rl.py rl --generation vllm --steps 8
    python benchmarks/gpu_rl.py sync
    python benchmarks/gpu_rl.py rl --generation transformers --backend torch --device cpu --steps 2  # smoke, CPU
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from protege.config import ModelConfig, RLConfig, WorldConfig
from protege.data.rows import load_rows
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.world.generate import generate_world
from protege.world.questions import make_item


def tiny_world(folder: Path):
    generate_world(WorldConfig(n_train=16, n_rl=64, n_val=8, n_test=8), folder)
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(200)]
    processor = StudentProcessor.create(train_tokenizer([i.question for i in items] + [i.answer for i in items], 512),
                                        64, 8, 2)
    return load_rows(folder / "rl.parquet"), processor


def rl(args) -> dict:
    from protege.rl.loop import RLInputs, run_rl

    with tempfile.TemporaryDirectory() as tmp:
        rows, processor = tiny_world(Path(tmp) / "world")
        student = build_student(ModelConfig(), processor, seed=0)
        # a judge that rewards some samples from the first step, so every update really changes the weights
        judge = lambda qs, refs, texts: [float(len(t) % 2) for t in texts]  # noqa: E731
        cfg = RLConfig(algorithm="dr_grpo", steps=args.steps, questions_per_step=args.questions, group_size=args.group,
                       max_new_tokens=args.new_tokens, save_every=10_000, eval_every=0, backend=args.backend,
                       zero_stage=2, device=args.device, generation=args.generation, vllm_memory=args.vllm_memory)
        logs: list[dict] = []
        before = {k: v.detach().clone() for k, v in student.state_dict().items()}
        t0 = time.perf_counter()
        run_rl(student, copy.deepcopy(student), processor, RLInputs(rows, judge=judge), cfg, Path(tmp) / "ckpt",
               seed=0, on_log=lambda s, m: logs.append(m))
        total = time.perf_counter() - t0
        changed = sum(not torch.equal(v.detach().cpu(), before[k].cpu()) for k, v in student.state_dict().items())
    timed = logs[1:] or logs  # the first step pays one-off costs (kernels, graphs, caches)
    med = lambda key: statistics.median(m[key] for m in timed)  # noqa: E731
    out = {"part": "rl", "generation": args.generation, "backend": args.backend, "device": args.device,
           "steps": len(logs), "sequences_per_step": args.questions * args.group,
           "rollout_tokens_per_s": med("rollout_tokens_per_s"), "update_s": med("update_s"), "sync_s": med("sync_s"),
           "step_s": statistics.median(args.questions * args.group / m["samples_per_s"] for m in timed),
           "total_s_with_startup": total, "tensors_changed": changed}
    if changed == 0:
        raise SystemExit(f"gpu_rl: FAILED: {args.steps} RL steps left every weight unchanged: {out}")
    return out


def sync(args) -> dict:
    """vLLM answers like transformers on the same weights, keeps the old answers until a sync, and answers like
    transformers on the new weights after it. bf16 in vLLM vs fp32 in torch may flip near-ties, so the
    comparisons count agreeing first tokens instead of asking for identity."""
    from protege.generation.transformers_backend import Sampling, sample
    from protege.generation.vllm_backend import generator_from_model

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        rows, processor = tiny_world(Path(tmp) / "world")
    rows = rows[:32]
    student = build_student(ModelConfig(), processor, seed=0).to(device).eval()
    batch = processor.encode_prompts([r.question for r in rows], [r.image for r in rows])
    images = [r.image for r in rows]
    greedy = Sampling(do_sample=False, max_new_tokens=8)

    def first_tokens(c) -> list[int]:
        return c.sequences[:, c.prompt_len].tolist()

    def agree(a, b) -> float:
        return sum(x == y for x, y in zip(a, b)) / len(a)

    t0 = time.perf_counter()
    gen = generator_from_model(student, processor, seed=0, memory=args.vllm_memory)
    startup = time.perf_counter() - t0
    hf_old = first_tokens(sample(student, processor, {k: v.to(device) for k, v in batch.items()}, greedy))
    vl_old = first_tokens(gen.sample(processor, batch, images, greedy))
    with torch.no_grad():  # a large, certain change: a freshly drawn LM head
        torch.manual_seed(1)
        student.lm_head.weight.normal_(0, 0.5)
    hf_new = first_tokens(sample(student, processor, {k: v.to(device) for k, v in batch.items()}, greedy))
    vl_stale = first_tokens(gen.sample(processor, batch, images, greedy))
    t0 = time.perf_counter()
    gen.sync_weights(student)
    sync_s = time.perf_counter() - t0
    vl_new = first_tokens(gen.sample(processor, batch, images, greedy))
    t0 = time.perf_counter()
    many = gen.sample(processor, batch, images, Sampling(do_sample=True, max_new_tokens=32), num_return_sequences=16)
    seconds = time.perf_counter() - t0
    gen.close()
    out = {"part": "sync", "startup_s": startup, "sync_s": sync_s,
           "agree_before": agree(vl_old, hf_old), "stale_until_sync": agree(vl_stale, vl_old),
           "agree_after": agree(vl_new, hf_new), "heads_differ": agree(hf_new, hf_old),
           "sampling_tokens_per_s": float(many.completion_mask.sum()) / seconds,
           "sampling_sequences": many.sequences.shape[0]}
    if out["agree_before"] < 0.9 or out["agree_after"] < 0.9 or out["stale_until_sync"] < 0.9:
        raise SystemExit(f"gpu_rl: FAILED: vLLM does not follow the policy's weights: {out}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["rl", "sync"])
    ap.add_argument("--generation", choices=["transformers", "vllm"], default="vllm")
    ap.add_argument("--backend", choices=["torch", "deepspeed"], default="deepspeed")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--vllm-memory", type=float, default=0.3)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_rl: FAILED: torch {torch.__version__} sees no CUDA device")
    print(json.dumps(rl(args) if args.part == "rl" else sync(args)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
