"""Activation bytes per token of ONE decoder layer of a real family at its real width (random init, no
download), beside the memory plan's figure for it (protege.models.activations, the layer traced on the meta
device: `plan_per_hidden` in each variant). For each variant the layer runs forward and
backward on T tokens and the probe reports what the forward keeps for the backward pass:

  plain           full fine-tuning (every weight trainable)
  checkpoint      the same layer under torch.utils.checkpoint (non-reentrant): only its input stays, the rest is
                  recomputed in the backward pass
  lora            peft LoRA (r=128, alpha=256, dropout 0.05, float32 adapters) on q/k/v/o and gate/up/down,
                  base weights frozen
  lora+checkpoint both

Measured two ways:
  saved_bytes     the tensors autograd saves for backward, seen through torch.autograd.graph.saved_tensors_hooks,
                  deduplicated by storage (views of one buffer count once) and without the parameters
                  themselves (a linear layer saves its weight, which is no activation) and without the rotary
                  cos / sin (computed once per model, shared by its layers). Device-independent as far as the
                  kernels save the same tensors (the attention kernel may differ: see `attn`). Under
                  non-reentrant checkpointing the hooks see what the checkpoint keeps: the layer's input.
  cuda_*          on CUDA also torch.cuda.memory_allocated after the forward minus before it and minus the output
                  (retained: the layer's input, allocated before, is not in it) and the max_memory_allocated delta
                  over forward + backward (peak: the recompute's and the backward kernels' transient memory, and
                  the weights' gradients, given apart as param_grad_bytes and taken out in
                  cuda_peak_less_grads_per_hidden).

The layer's input requires grad (as in a model whose earlier layers train), so both variants keep it. Prints
one JSON line: per variant bytes per token, and bytes per token per hidden unit (`per_hidden`), and
`values_per_hidden` (per_hidden / bytes of the dtype).

    python benchmarks/activation_bytes.py --family qwen2.5-vl-7b --tokens 4096 --device cuda
    python benchmarks/activation_bytes.py --tokens 64 --device cpu                          # CPU, real width
    python benchmarks/activation_bytes.py --family tiny --tokens 32 --device cpu            # smoke, seconds
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

# the text decoders of real families (Qwen2.5-VL's text model is Qwen2's decoder layer: RMSNorm, grouped-query
# attention with q/k/v biases, SwiGLU MLP; M-RoPE changes only the cos/sin the layer is handed)
FAMILIES = {
    "qwen2.5-vl-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4),
    "qwen2.5-vl-3b": dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2),
    "qwen2.5-vl-32b": dict(hidden_size=5120, intermediate_size=27648, num_attention_heads=40, num_key_value_heads=8),
    "tiny": dict(hidden_size=128, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2),
}
VARIANTS = ("plain", "checkpoint", "lora", "lora+checkpoint")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_layer(family: str, dtype: torch.dtype, device: torch.device, attn: str):
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    config = Qwen2Config(**FAMILIES[family], num_hidden_layers=1, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                         max_position_embeddings=32768, vocab_size=1024)
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        layer = Qwen2DecoderLayer(config, layer_idx=0).to(dtype)
        rotary = Qwen2RotaryEmbedding(config)
    return config, layer, rotary


class Wrapper(torch.nn.Module):
    """One decoder layer as a module of the hidden states alone (what peft wraps and checkpoint calls)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden, cos, sin):
        out = self.layer(hidden, attention_mask=None, position_ids=None, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


def with_lora(module: torch.nn.Module, rank: int, dropout: float) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=LORA_TARGETS, bias="none")
    return get_peft_model(module, cfg)


class SavedBytes:
    """saved_tensors_hooks that count the distinct storages autograd keeps for backward, parameters left out."""

    def __init__(self, exclude_ptrs: set[int]):
        self.exclude = exclude_ptrs
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        try:
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without storage: its own size
            ptr, nbytes = id(t), t.numel() * t.element_size()
        if ptr not in self.exclude and nbytes:
            self.seen[ptr] = max(self.seen.get(ptr, 0), nbytes)
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def measure(variant: str, family: str, tokens: int, dtype: torch.dtype, device: torch.device, attn: str,
            lora_rank: int, lora_dropout: float) -> dict:
    from torch.utils.checkpoint import checkpoint

    config, layer, rotary = build_layer(family, dtype, device, attn)
    module: torch.nn.Module = Wrapper(layer)
    if variant.startswith("lora"):
        module = with_lora(module, lora_rank, lora_dropout)  # float32 adapters, as protege's add_lora leaves them
    module.train()
    hidden = config.hidden_size
    torch.manual_seed(1)
    x = (torch.randn(1, tokens, hidden, device=device, dtype=dtype) * 0.5).requires_grad_(True)
    pos = torch.arange(tokens, device=device)[None]
    with torch.no_grad():
        cos, sin = rotary(x, pos)
    # not the layer's: its weights, and the rotary cos / sin a whole model computes once for every layer
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    params |= {cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()}
    recompute = variant.endswith("checkpoint")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        start_alloc = torch.cuda.memory_allocated()
    counter = SavedBytes(params)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        if recompute:
            y = checkpoint(module, x, cos, sin, use_reentrant=False)
        else:
            y = module(x, cos, sin)
    saved = counter.total
    if cuda:
        torch.cuda.synchronize()
        retained = torch.cuda.memory_allocated() - start_alloc - y.untyped_storage().nbytes()
    y.float().pow(2).mean().backward()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - start_alloc
    seconds = time.perf_counter() - t0
    grads = sum(p.grad is not None for p in module.parameters())
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in module.parameters() if p.grad is not None)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    dbytes = torch.finfo(dtype).bits // 8
    out = {"saved_bytes": saved, "bytes_per_token": saved / tokens, "per_hidden": saved / tokens / hidden,
           "values_per_hidden": saved / tokens / hidden / dbytes, "trainable_params": trainable,
           "params_with_grad": grads, "seconds": seconds}
    if cuda:  # the weights' gradients are no activations: the peak is also given without them
        out.update(cuda_retained_per_token=retained / tokens, cuda_retained_per_hidden=retained / tokens / hidden,
                   cuda_peak_delta_per_token=peak / tokens, cuda_peak_delta_per_hidden=peak / tokens / hidden,
                   param_grad_bytes=grad_bytes,
                   cuda_peak_less_grads_per_hidden=(peak - grad_bytes) / tokens / hidden)
    del module, layer, x, y
    if cuda:
        torch.cuda.empty_cache()
    return out


def plan_per_hidden(variant: str, family: str, dtype: torch.dtype, device: torch.device, lora_rank: int,
                    lora_dropout: float) -> float:
    """What the memory plan counts for this layer, per token per hidden unit."""
    from transformers import Qwen2Config

    from protege.models.activations import LoraSpec, activation_profile

    config = Qwen2Config(**FAMILIES[family], num_hidden_layers=1, vocab_size=1024)
    lora = None
    if variant.startswith("lora"):
        modules = tuple(("self_attn." if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp.") + t
                        for t in LORA_TARGETS)
        lora = LoraSpec(modules, lora_rank, lora_dropout)
    profile = activation_profile(config, dtype, lora=lora, device_type=device.type)
    return (profile.layer_input if variant.endswith("checkpoint") else profile.per_layer) / config.hidden_size


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="qwen2.5-vl-7b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                    help="attention kernel (sdpa: flash / memory-efficient where the device has them)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--lora-rank", type=int, default=128)
    ap.add_argument("--lora-dropout", type=float, default=0.05)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"activation_bytes: FAILED: torch {torch.__version__} sees no CUDA device")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"activation_bytes: unknown variants {unknown}; expected some of {list(VARIANTS)}")
    result = {"part": "activation_bytes", "family": args.family, **FAMILIES[args.family], "tokens": args.tokens,
              "dtype": args.dtype, "device": args.device, "attn": args.attn, "lora_rank": args.lora_rank,
              "lora_dropout": args.lora_dropout,
              "torch": torch.__version__,
              "variants": {v: {**measure(v, args.family, args.tokens, dtype, device, args.attn, args.lora_rank,
                                         args.lora_dropout),
                               "plan_per_hidden": plan_per_hidden(v, args.family, dtype, device, args.lora_rank,
                                                                  args.lora_dropout)}
                           for v in variants}}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
