"""The GPU check's Python half (benchmarks/gpu_check.sh runs it): the tiny world's student trained by the RL
loop with DeepSpeed ZeRO-2 on CUDA, rollouts from vLLM or transformers, and a check that vLLM follows the
policy's weights after a sync. Prints one JSON line per part; exits non-zero, with the reason, on failure.

    python benchmarks/gpu_rl.py rl --generation vllm --steps 8
    python benchmarks/gpu_rl.py sync
    python benchmarks/gpu_rl.py rl --generation transformers --backend torch --device cpu --steps 2  # smoke, CPU
    python benchmarks/gpu_rl.py rl --dtype bfloat16 --trainable lora --zero 3 --vocab 151936  # a real vocabulary

The rl part also prints the device's peak memory (torch.cuda.max_memory_allocated) beside `protege plan`'s
estimate for the same configuration.
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


def grown(student, vocab: int):
    """The student with `vocab` rows of embeddings and LM head (zero new LM-head rows: sampling keeps to the
    tokenizer's own tokens)."""
    old = student.get_output_embeddings().weight.shape[0]
    if vocab > old:
        student.resize_token_embeddings(vocab, mean_resizing=False)
        with torch.no_grad():
            student.get_output_embeddings().weight[old:] = 0.0
        student.config.get_text_config().vocab_size = vocab
    return student


def planned_peak(folder: Path, cfg: RLConfig, dtype: str) -> float:
    """`protege plan`'s rl estimate (GiB per rank) for this configuration on this device."""
    from protege.config import Config
    from protege.plan import GiB, model_shape, plan_stages

    conf = Config.model_validate({"model": {"path": str(folder), "dtype": dtype}, "rl": cfg.model_dump()})
    total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    [plan] = [p for p in plan_stages(conf, model_shape(conf, folder, folder), device_bytes=total) if p.stage == "rl"]
    return plan.peak / GiB


def rl(args) -> dict:
    from protege.models.lora import add_lora
    from protege.models.student import save_student
    from protege.rl.loop import RLInputs, run_rl

    with tempfile.TemporaryDirectory() as tmp:
        rows, processor = tiny_world(Path(tmp) / "world")
        student = grown(build_student(ModelConfig(), processor, seed=0), args.vocab)
        save_student(student, processor, Path(tmp) / "model")
        student = student.to(getattr(torch, args.dtype))
        ref = None if args.trainable == "lora" else copy.deepcopy(student)
        if args.trainable == "lora":
            student = add_lora(student, rank=16, alpha=32, dropout=0.0, target_modules="auto")
        # a judge that rewards some samples from the first step, so every update really changes the weights
        judge = lambda qs, refs, texts: [float(len(t) % 2) for t in texts]  # noqa: E731
        cfg = RLConfig(algorithm="dr_grpo", steps=args.steps, questions_per_step=args.questions, group_size=args.group,
                       max_new_tokens=args.new_tokens, save_every=10_000, eval_every=0, backend=args.backend,
                       zero_stage=args.zero, device=args.device, generation=args.generation,
                       vllm_memory=args.vllm_memory, trainable=args.trainable)
        logs: list[dict] = []
        before = {k: v.detach().clone() for k, v in student.state_dict().items()}
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        run_rl(student, ref, processor, RLInputs(rows, judge=judge, max_prompt_tokens=256), cfg, Path(tmp) / "ckpt",
               seed=0, on_log=lambda s, m: logs.append(m))
        total = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
        planned = planned_peak(Path(tmp) / "model", cfg, args.dtype)
        changed = sum(not torch.equal(v.detach().cpu(), before[k].cpu()) for k, v in student.state_dict().items())
    timed = logs[1:] or logs  # the first step pays one-off costs (kernels, graphs, caches)
    med = lambda key: statistics.median(m[key] for m in timed)  # noqa: E731
    out = {"part": "rl", "generation": args.generation, "backend": args.backend, "device": args.device,
           "steps": len(logs), "sequences_per_step": args.questions * args.group,
           "rollout_tokens_per_s": med("rollout_tokens_per_s"), "update_s": med("update_s"), "sync_s": med("sync_s"),
           "step_s": statistics.median(args.questions * args.group / m["samples_per_s"] for m in timed),
           "total_s_with_startup": total, "tensors_changed": changed, "dtype": args.dtype,
           "trainable": args.trainable, "zero": args.zero, "vocab": args.vocab, "peak_gib": peak, "plan_gib": planned,
           "micro_batches": med("micro_batches"),
           **({"tis_weight_mean": med("tis_weight_mean")} if "tis_weight_mean" in timed[0] else {})}
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
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--trainable", default="attention+embeddings+head")
    ap.add_argument("--zero", type=int, choices=[2, 3], default=2)
    ap.add_argument("--vocab", type=int, default=0, help="grow the vocabulary to this many rows (0: as trained)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_rl: FAILED: torch {torch.__version__} sees no CUDA device")
    print(json.dumps(rl(args) if args.part == "rl" else sync(args)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
