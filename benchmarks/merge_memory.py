"""Peak memory of `protege merge` on 8 checkpoints of a ~150 MB model, against one checkpoint and its largest tensor.

Writes 8 Qwen2ForCausalLM checkpoints (random base + 7 perturbed copies; tied embeddings, so the 40000 x 512
embedding is the one largest tensor), merges them with each method asked for in a child process, and reads
the child's peak RSS from os.wait4 (ru_maxrss of that child alone). The baseline is the peak RSS of a child
that only imports protege.merging, torch and safetensors, so the merge's own memory is peak - baseline.
Everything written is deleted at the end.

This parent process never imports torch and writes the checkpoints from a child: a child's ru_maxrss starts
from its parent's high-water RSS at fork/exec (Linux keeps it across execve), so a big parent would hide the
children's own peaks.

    .venv/bin/python benchmarks/merge_memory.py [--methods ties,linear] [--workdir /tmp/x] [--keep]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

CONFIG = dict(vocab_size=40000, hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True)
N_MODELS = 8
MB = 1024 * 1024


def make_checkpoints(root: Path) -> list[Path]:
    """Runs in a child (--make): writes the checkpoints and prints their sizes as JSON."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from protege.merging.io import Checkpoint

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG))
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = []
    for i in range(N_MODELS):
        if i:
            g = torch.Generator().manual_seed(i)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(base[n] + 0.01 * torch.randn(p.shape, generator=g))
        path = root / f"m{i}"
        model.save_pretrained(path)
        out.append(path)
    ck = Checkpoint(out[0])
    largest = max(ck.tensors, key=lambda n: ck.tensors[n].nbytes)
    print(json.dumps({"paths": [str(p) for p in out], "size": ck.nbytes, "tensors": len(ck.tensors),
                      "disk": (out[0] / "model.safetensors").stat().st_size, "largest": largest,
                      "largest_shape": list(ck.tensors[largest].shape), "largest_bytes": ck.tensors[largest].nbytes}))
    return out


def child_peak(cmd: list[str]) -> tuple[int, float, int, str]:
    """(peak RSS bytes of that child, seconds, exit code, stderr tail)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-600:]
    return usage.ru_maxrss * 1024, time.perf_counter() - t0, proc.returncode, tail


def method_config(method: str, ckpts: list[Path]) -> dict:
    base, others = str(ckpts[0]), [str(c) for c in ckpts[1:]]
    if method == "linear":
        return {"merge_method": "linear", "models": [{"model": str(c)} for c in ckpts], "parameters": {"weight": 1}}
    if method == "slerp":
        return {"merge_method": "slerp", "base_model": base, "models": [{"model": others[0]}],
                "parameters": {"t": 0.5}}
    if method == "model_stock":
        return {"merge_method": "model_stock", "base_model": base, "models": [{"model": c} for c in others]}
    params = {"weight": 1.0, "density": 0.5}
    if method.startswith("breadcrumbs"):
        params["gamma"] = 0.01
    return {"merge_method": method, "base_model": base, "models": [{"model": c, "parameters": params}
                                                                   for c in others]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="ties,linear", help="comma-separated merge methods")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints and outputs")
    ap.add_argument("--make", type=Path, default=None, help=argparse.SUPPRESS)  # the child that writes them
    args = ap.parse_args(argv)
    if args.make is not None:
        make_checkpoints(args.make)
        return 0
    root = args.workdir or Path(tempfile.mkdtemp(prefix="merge-memory-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        made = subprocess.run([sys.executable, __file__, "--make", str(root / "ckpts")], capture_output=True,
                              text=True)
        if made.returncode:
            print(made.stderr[-2000:])
            return 1
        info = json.loads(made.stdout.strip().splitlines()[-1])
        ckpts = [Path(p) for p in info["paths"]]
        size, largest_bytes = info["size"], info["largest_bytes"]
        print(f"{N_MODELS} checkpoints written in {time.perf_counter() - t0:.0f} s: one is "
              f"{info['disk'] / MB:.1f} MB on disk ({size / MB:.1f} MB of tensors, {info['tensors']} tensors); "
              f"largest tensor {info['largest']} {info['largest_shape']} = {largest_bytes / MB:.1f} MB; "
              f"all {N_MODELS} inputs = {N_MODELS * size / MB:.0f} MB; this process's peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB",
              flush=True)
        base_rss, _, code, tail = child_peak([sys.executable, "-c", "import protege.merging, torch, safetensors"])
        if code:
            print(tail)
            return 1
        print(f"baseline (python -c 'import protege.merging, torch, safetensors'): peak RSS {base_rss / MB:.0f} MB",
              flush=True)
        bad = 0
        for method in [m for m in args.methods.split(",") if m]:
            cfg = root / f"{method}.yaml"
            cfg.write_text(yaml.safe_dump(method_config(method, ckpts)))
            out = root / f"out-{method}"
            peak, secs, code, tail = child_peak([sys.executable, "-m", "protege.cli", "merge", str(cfg), str(out)])
            if code:
                bad += 1
                print(f"{method}: FAILED ({code}): {tail}", flush=True)
                continue
            net = peak - base_rss
            print(f"{method:<12} peak RSS {peak / MB:7.0f} MB in {secs:5.1f} s | net of baseline {net / MB:6.0f} MB"
                  f" = {net / largest_bytes:4.1f} x largest tensor = {net / size:4.2f} x one checkpoint "
                  f"(peak / checkpoint = {peak / size:4.2f}; all inputs = {N_MODELS * size / MB:.0f} MB)",
                  flush=True)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
        return 1 if bad else 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
