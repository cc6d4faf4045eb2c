"""Loading a student and a discriminator onto a device the way the stages do (load_model, load_discriminator),
and how much host memory that took: on a GPU the weights go from the safetensors files straight to the device,
so the host's resident memory must not grow by a copy of the model. The single-GPU check's `direct-load` part.

A child process writes the student (the embedded Qwen2-VL architecture at --hidden / --layers / --vocab, bf16)
once; a second process loads it onto --device as the policy (model.dtype bfloat16) and as the discriminator, and
prints one JSON line: the checkpoint's bytes, the host's peak resident memory added by each load (VmHWM after the
imports), the device memory each load allocated, and `passed` (on CUDA: each load added less than half the
model's bytes to the host; on the CPU the model is the host's, so only that it loaded).

    python benchmarks/direct_load.py --device cuda                        # 7B width, 2 layers: 3.1 GB
    python benchmarks/direct_load.py --device cpu --hidden 64 --intermediate 256 --heads 2 --kv-heads 1 --vocab 400
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM to the current resident size."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def build(folder: Path, args) -> None:
    import random

    import torch
    from transformers import GenerationConfig, Qwen2VLForConditionalGeneration

    from protege.config import ModelConfig
    from protege.models.processor import StudentProcessor
    from protege.models.student import tiny_config
    from protege.models.tokenizer import train_tokenizer
    from protege.world.questions import make_item

    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(50)]
    processor = StudentProcessor.create(train_tokenizer([i.question for i in items] + [i.answer for i in items], 300),
                                        64, 8, 2)
    config = tiny_config(ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                     num_kv_heads=args.kv_heads, intermediate_size=args.intermediate,
                                     initializer_range=0.02), processor)
    config.text_config.vocab_size = max(args.vocab, len(processor.tokenizer))
    torch.set_default_dtype(torch.bfloat16)  # never a float32 copy, even here
    model = Qwen2VLForConditionalGeneration(config)
    torch.set_default_dtype(torch.float32)
    tok = processor.tokenizer
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)


def measure(folder: Path, device_name: str) -> dict:
    import torch

    from protege.config import Config
    from protege.models.discriminator import load_discriminator
    from protege.stages.student_model import load_model

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    model_bytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    cfg = Config()
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": "bfloat16"})})
    out = {"part": "direct_load", "device": device_name, "model_gib": round(model_bytes / 2**30, 3)}
    for name, load in (("policy", lambda: load_model(cfg, folder, device)[0]),
                       ("discriminator", lambda: load_discriminator(folder, from_student=True, dtype="bfloat16",
                                                                     device=device))):
        reset_peak()
        before_host = status_kib("VmRSS") * 1024
        before_device = torch.cuda.memory_allocated(device) if cuda else 0
        model = load()
        host_added = status_kib("VmHWM") * 1024 - before_host
        device_added = (torch.cuda.memory_allocated(device) - before_device) if cuda else 0
        where = {p.device.type for p in model.parameters()}
        out[name] = {"host_added_gib": round(host_added / 2**30, 3), "device_added_gib": round(device_added / 2**30, 3),
                     "on": sorted(where)}
        del model
        if cuda:
            torch.cuda.empty_cache()
    out["passed"] = all(out[n]["on"] == [device.type] and (not cuda or out[n]["host_added_gib"] < out["model_gib"] / 2)
                        for n in ("policy", "discriminator"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hidden", type=int, default=3584)
    ap.add_argument("--intermediate", type=int, default=18944)
    ap.add_argument("--heads", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=152_064)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_only:
        build(args.folder, args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "student"
        subprocess.run([sys.executable, __file__, "--build-only", "--folder", str(folder), "--hidden", str(args.hidden),
                        "--intermediate", str(args.intermediate), "--heads", str(args.heads), "--kv-heads",
                        str(args.kv_heads), "--layers", str(args.layers), "--vocab", str(args.vocab)],
                       check=True, cwd=REPO)
        result = measure(folder, args.device)
    print(json.dumps(result), flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
