"""The memory plan's activation figures against the CPU allocator's measured peaks, for real families' text
models at their released widths, truncated to 1 and 2 decoder layers (random init, no download).

Each phase runs protege's own code on a batch of `--rows` x `--tokens` tokens:
  update            the policy's log-probs (protege.models.logprobs.scored_positions, chunked LM head) and
                    backward, every decoder weight training
  update+recompute  the same under gradient checkpointing (model.gradient_checkpointing)
  lora              peft LoRA (r 128, alpha 256, dropout 0.05) on the decoder's linear layers (target auto)
  lora+recompute    both
  discriminator     protege.models.discriminator.Discriminator on the same backbone (its d -> 1 head), backward
  reference         the log-probs without a graph (the reference's and the old policy's pass)

Measured: the CPU allocator's peak over the phase above what was allocated before it (torch.profiler's memory
timeline), the weights' gradients left out (the plan counts those apart). Per layer: the 2-layer model's figure
less the 1-layer one's, per token. Plan: protege.models.activations (the family's layer traced on the meta
device) as protege.plan reads it. Prints one JSON line per family and dtype, and a table of plan against
measured per phase (per-layer bytes per token, and the 2-layer phase's whole activation peak).

    .venv/bin/python benchmarks/plan_calibration.py                      # three families, bf16 and fp32
    .venv/bin/python benchmarks/plan_calibration.py --families qwen2.5-vl-7b --dtypes bfloat16
    .venv/bin/python benchmarks/plan_calibration.py --replan run.err     # the plan again, same measurements
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

# the text models of three families of the model matrix at their released widths
FAMILIES = {
    # Qwen2.5-VL-7B's language model (Qwen2 decoder: q/k/v biases, GQA 28/4, SwiGLU 18944)
    "qwen2.5-vl-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                                    num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6,
                                    rope_theta=1_000_000.0, tie_word_embeddings=False)),
    # Idefics3-8B / LLaVA-NeXT-8B's language model, Llama 3.1 8B (GQA 32/8, SwiGLU 14336)
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256, rope_theta=500_000.0,
                                   tie_word_embeddings=False)),
    # Gemma 3 4B's language model (head_dim 256, q/k norms, four norms per layer, GeGLU 10240, tied 262k head)
    "gemma-3-4b": ("gemma3_text", dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8,
                                       num_key_value_heads=4, head_dim=256, vocab_size=262208,
                                       sliding_window=1024, tie_word_embeddings=True)),
}
PHASES = ("update", "update+recompute", "lora", "lora+recompute", "discriminator", "reference")
LORA = dict(rank=128, alpha=256.0, dropout=0.05)


def config_for(family: str, layers: int):
    from transformers import AutoConfig

    model_type, kwargs = FAMILIES[family]
    config = AutoConfig.for_model(model_type, num_hidden_layers=layers, **kwargs)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:layers]
    config._attn_implementation = "sdpa"
    return config


def build(family: str, layers: int, dtype: torch.dtype, phase: str):
    """The truncated model for a phase, and the trainable weights whose gradients the plan counts apart."""
    from transformers import AutoModelForCausalLM

    from protege.models.discriminator import Discriminator, base_model
    from protege.models.lora import add_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_for(family, layers), dtype=dtype)
    # the embeddings and the LM head stay frozen here: the activations do not depend on them, and their
    # gradients (a 152k x 3584 table) would only crowd a CPU's memory
    model.requires_grad_(False)
    if phase == "discriminator":
        model = Discriminator(base_model(model))
        model.backbone.layers.requires_grad_(True)
        model.head.requires_grad_(True)
    elif phase.startswith("lora"):
        model = add_lora(model, LORA["rank"], LORA["alpha"], LORA["dropout"], "auto")
    elif phase != "reference":
        model.model.layers.requires_grad_(True)
    if phase.endswith("recompute"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def run_phase(model, phase: str, rows: int, tokens: int) -> None:
    from protege.models.logprobs import scored_positions

    g = torch.Generator().manual_seed(1)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (rows, tokens), generator=g)
    mask = torch.ones(rows, tokens, dtype=torch.long)
    if phase == "discriminator":
        model(ids, mask).float().sum().backward()
        return
    keep = torch.ones(rows, tokens - 1, dtype=torch.bool)
    if phase == "reference":
        with torch.no_grad():
            scored_positions(model, {"input_ids": ids, "attention_mask": mask}, 0, keep)
        return
    logp, _, _ = scored_positions(model, {"input_ids": ids, "attention_mask": mask}, 0, keep)
    logp.sum().backward()


def allocator_peak(fn) -> int:
    """The CPU allocator's peak above what was allocated before `fn` ran (torch.profiler's memory timeline),
    the weights' gradients left out (the plan counts them apart)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, Category

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    memory = prof._memory_profile()
    now = peak = 0
    for _, action, (key, version), size in memory.timeline:
        if memory._categories.get(key, version) == Category.GRADIENT:
            continue
        if action == Action.CREATE:
            now += size
        elif action == Action.DESTROY:
            now -= size
        peak = max(peak, now)
    return peak


def measure(family: str, layers: int, dtype: torch.dtype, phase: str, rows: int, tokens: int) -> dict:
    model = build(family, layers, dtype, phase)
    t0 = time.perf_counter()
    peak = allocator_peak(functools.partial(run_phase, model, phase, rows, tokens))
    out = {"peak": peak, "seconds": round(time.perf_counter() - t0, 1)}
    del model
    return out


def plan_for(family: str, dtype: torch.dtype, phase: str, rows: int, tokens: int) -> dict:
    """What the plan predicts for the phase (protege.plan's own functions): per-layer bytes per token, and the
    2-layer model's activations + LM-head chunk at this batch."""
    from transformers import AutoModelForCausalLM

    from protege.models.activations import LoraSpec, activation_profile, in_layer_name
    from protege.models.lora import lora_targets
    from protege.plan import activation_bytes, backward_peak, forward_peak

    config = config_for(family, 2)
    lora = None
    if phase.startswith("lora"):
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
        modules = tuple(sorted({in_layer_name(n + ".weight")[:-len(".weight")] for n in lora_targets(meta, "auto")}))
        lora = LoraSpec(modules, LORA["rank"], LORA["dropout"])
    prof = activation_profile(config, dtype, lora=lora, device_type="cpu")
    recompute = phase.endswith("recompute")
    per_layer = 0 if phase == "reference" else (prof.layer_input if recompute else prof.per_layer)
    n = rows * tokens
    if phase == "reference":
        return {"per_layer": per_layer, "total": forward_peak(prof, n, config.vocab_size)}
    total = activation_bytes(prof, n, recompute=recompute)
    if phase == "discriminator":
        total += n * prof.transient(recompute)  # one layer's backward (no LM head)
    else:
        total += backward_peak(prof, n, config.vocab_size, recompute)
    return {"per_layer": per_layer, "total": total}


def row(family: str, dname: str, phase: str, rows: int, tokens: int, measured_layer: float, measured_total: int,
        seconds: float) -> dict:
    plan = plan_for(family, getattr(torch, dname), phase, rows, tokens)
    return {"part": "plan_calibration", "family": family, "dtype": dname, "phase": phase, "rows": rows,
            "tokens": tokens, "plan_per_layer": plan["per_layer"], "measured_per_layer": round(measured_layer, 1),
            "plan_total": plan["total"], "measured_total": measured_total, "seconds": seconds}


def line(r: dict) -> str:
    def diff(p, m):
        return f"{(p - m) / m:+.1%}" if m and p else "-"

    return (f"| {r['family']} | {r['dtype']} | {r['phase']} | {r['plan_per_layer']:.0f} | "
            f"{r['measured_per_layer']:.0f} | {diff(r['plan_per_layer'], r['measured_per_layer'])} | "
            f"{r['plan_total'] / 2**20:.1f} | {r['measured_total'] / 2**20:.1f} | "
            f"{diff(r['plan_total'], r['measured_total'])} |")


HEADER = ("| family | dtype | phase | per layer plan (B/token) | measured | diff | 2-layer peak plan (MiB) | "
          "measured | diff |\n|---|---|---|---:|---:|---:|---:|---:|---:|")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--replan", type=Path, help="a file of an earlier run's JSON lines (its stderr): print the "
                                                "plan's figures for its measurements again, measuring nothing")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    families = [f for f in args.families.split(",") if f]
    phases = [p for p in args.phases.split(",") if p]
    bad = sorted(set(families) - set(FAMILIES)) + sorted(set(phases) - set(PHASES))
    if bad:
        raise SystemExit(f"plan_calibration: unknown {bad}; families {list(FAMILIES)}, phases {list(PHASES)}")
    print(HEADER, flush=True)
    if args.replan:  # the plan's side again, for measurements an earlier run printed (its JSON lines)
        results = []
        for text in args.replan.read_text().splitlines():
            if text.startswith("{") and '"plan_calibration"' in text:
                old = json.loads(text)
                results.append(row(old["family"], old["dtype"], old["phase"], old["rows"], old["tokens"],
                                   old["measured_per_layer"], old["measured_total"], old["seconds"]))
                print(line(results[-1]), flush=True)
        return results
    results, n = [], args.rows * args.tokens
    for family in families:
        for dname in [d for d in args.dtypes.split(",") if d]:
            dtype = getattr(torch, dname)
            for phase in phases:
                one = measure(family, 1, dtype, phase, args.rows, args.tokens)
                two = measure(family, 2, dtype, phase, args.rows, args.tokens)
                r = row(family, dname, phase, args.rows, args.tokens, (two["peak"] - one["peak"]) / n, two["peak"],
                        one["seconds"] + two["seconds"])
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
                print(line(r), flush=True)
    return results


if __name__ == "__main__":
    main()
