"""Activation memory of a model's text decoder, traced from its own code on the meta device.

What a forward pass keeps for the backward pass depends on the family's layer (norms that upcast to fp32,
gated or plain MLP and its width, grouped-query attention, q/k norms, extra norms), on what trains (a frozen
linear layer keeps nothing of its input; a LoRA adapter keeps its dropout's mask and output and its rank-r
activation) and on the dtype. No fixed "values per hidden unit" rule fits them all, so the figure is traced:
the family's text model is built on the meta device (no memory, no weights) at 1 and 2 layers, run forward on a
few tokens under `torch.autograd.graph.saved_tensors_hooks`, and the distinct storages autograd saves are
counted (parameters and the rotary tables, shared by all layers, left out). One layer's bytes per token is the
difference of the two, the rest (embeddings' output, the final norm) what the 1-layer model keeps besides.

Two kernels differ on the meta device from a real one and are replaced while tracing:
- attention: on meta, scaled_dot_product_attention takes its math path (a tokens x tokens matrix); the
  fused kernels that run on CPU and GPU keep query, key, value (grouped-query: unrepeated), output and the
  log-sum-exp per head and token; the trace uses an attention function that keeps exactly those;
- dropout (LoRA's): on the CPU it keeps its mask in the input's dtype, on CUDA (fused) as one byte per value.

benchmarks/plan_calibration.py checks the traced figures against the CPU allocator's measured peak for real
families at their released widths.
"""
from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass

import torch

from protege.models.layer_names import split_layer_name

TRACE_TOKENS = 16
_ATTENTION = "protege_trace"


@dataclass(frozen=True)
class LoraSpec:
    modules: tuple[str, ...]   # in-layer module names that get adapters ("self_attn.q_proj", ...)
    rank: int
    dropout: float


@dataclass(frozen=True)
class ActivationProfile:
    """Bytes per token a forward keeps for the backward pass, split where the plan needs it."""

    per_layer: int      # one decoder layer, without recompute
    layer_input: int    # one layer's input: what a layer under gradient checkpointing keeps
    outside: int        # outside the decoder layers (embeddings' output, final norm)
    largest: int        # the largest single tensor one layer keeps (a no-grad forward's working set is a few)
    layers: int

    def kept(self, recompute: bool) -> int:
        """One token's activations kept from the end of the forward into the backward: every layer's saved
        tensors, or under recompute every layer's input."""
        return (self.layers * self.layer_input if recompute else self.layers * self.per_layer) + self.outside

    def transient(self, recompute: bool) -> int:
        """What the backward pass adds per token while it goes through one layer: the gradients of its two
        largest activations at once (benchmarks/plan_calibration.py), and under recompute the layer's own
        activations, recomputed."""
        return (self.per_layer if recompute else 0) + 2 * self.largest

    def training(self, recompute: bool) -> int:
        """One token's activations at the peak of a forward and backward, the LM head's chunk apart."""
        return self.kept(recompute) + self.transient(recompute)

    def inference(self) -> int:
        """One token's working set in a no-grad forward (scoring, the reference): the layer's input and output
        and the largest intermediates alive at once (a gated MLP's gate, up and product)."""
        return 3 * self.largest + 2 * self.layer_input


def in_layer_name(name: str) -> str | None:
    """'model.language_model.layers.3.self_attn.q_proj.weight' -> 'self_attn.q_proj.weight' (None: no layer)."""
    split = split_layer_name(name)
    return None if split is None else split.suffix


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class _FusedAttention(torch.autograd.Function):
    """The fused attention kernels' saved tensors: q, k, v, the output and a float32 log-sum-exp per head."""

    @staticmethod
    def forward(ctx, q, k, v):
        b, h, t, _ = q.shape
        out = q.new_empty(b, t, h, v.shape[-1]).transpose(1, 2)  # the kernels' output layout (tokens, heads)
        lse = q.new_empty(b, h, t, dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _trace_attention(module, query, key, value, attention_mask, **kwargs):
    return _FusedAttention.apply(query, key, value).transpose(1, 2), None


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask_dtype):
        mask = torch.empty(x.shape, dtype=mask_dtype, device=x.device)
        ctx.save_for_backward(mask)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(_ATTENTION, _trace_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_ATTENTION, lambda *a, **k: None)


@contextlib.contextmanager
def _traced_kernels(device_type: str):
    _register_attention()
    original = torch.nn.functional.dropout

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        return _Dropout.apply(x, torch.bool if device_type == "cuda" else x.dtype)

    torch.nn.functional.dropout = dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = original


def _truncated(config, layers: int):
    text = copy.deepcopy(text_config(config))
    text.num_hidden_layers = layers
    types = getattr(text, "layer_types", None)  # one entry per layer: cut, or repeated when the config has fewer
    if isinstance(types, list) and types and len(types) != layers:
        text.layer_types = (types * layers)[:layers]
    text._attn_implementation = _ATTENTION
    if hasattr(text, "use_cache"):
        text.use_cache = False
    return text


def _saved_bytes(config, layers: int, dtype: torch.dtype, trains: frozenset[str] | None, lora: LoraSpec | None,
                 tokens: int) -> tuple[int, int]:
    """(bytes the forward saves, bytes of the largest single saved tensor) for the text model at `layers`."""
    from transformers import AutoModel

    text = _truncated(config, layers)
    with torch.device("meta"):
        model = AutoModel.from_config(text, trust_remote_code=False).to(dtype)
        if lora is not None:
            from peft import LoraConfig, get_peft_model

            # as protege.models.lora.add_lora: peft keeps the adapters in float32 on a bf16 model, so their
            # dropout's mask and output, and their rank-r activations, are float32 too
            model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=2 * lora.rank, lora_dropout=lora.dropout,
                                                     target_modules=list(lora.modules), bias="none"))
        else:
            for name, p in model.named_parameters():
                p.requires_grad_(trains is None or in_layer_name(name) in trains)
        hidden = text.hidden_size
        # the first layer's input requires grad when anything before it trains; a middle layer's always does,
        # and the trace's per-layer figure is the second layer's
        x = torch.empty(1, tokens, hidden, dtype=dtype).requires_grad_(True)
        # a mask given spares the mask helpers' look for packed sequences (data-dependent: no meta kernel)
        mask = torch.ones(1, tokens, dtype=torch.long)
    model.train()
    skip = {p.untyped_storage()._cdata for p in model.parameters()}
    skip |= {b.untyped_storage()._cdata for b in model.buffers()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in skip and key != x.untyped_storage()._cdata:
            seen[key] = max(seen.get(key, 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(inputs_embeds=x, attention_mask=mask, use_cache=False)
    del out
    return sum(seen.values()), max(seen.values(), default=0)


@functools.lru_cache(maxsize=64)
def _profile(cls, config_json: str, dtype: torch.dtype, trains: frozenset[str] | None, lora: LoraSpec | None,
             device_type: str) -> ActivationProfile:
    config = _config(cls, config_json)
    with _traced_kernels(device_type):
        one, _ = _saved_bytes(config, 1, dtype, trains, lora, TRACE_TOKENS)
        two, largest = _saved_bytes(config, 2, dtype, trains, lora, TRACE_TOKENS)
    text = text_config(config)
    per_layer = (two - one) // TRACE_TOKENS
    return ActivationProfile(per_layer=per_layer, layer_input=text.hidden_size * torch.finfo(dtype).bits // 8,
                             outside=max(0, one // TRACE_TOKENS - per_layer), largest=largest // TRACE_TOKENS,
                             layers=int(text.num_hidden_layers))


def _config(cls, config_json: str):
    import json

    return cls.from_dict(json.loads(config_json))


def activation_profile(config, dtype: torch.dtype, *, trains: frozenset[str] | None = None,
                       lora: LoraSpec | None = None, device_type: str = "cpu") -> ActivationProfile:
    """The traced activation profile of `config`'s text decoder. `trains`: the in-layer parameter names that
    train (None: all of them); `lora`: adapters instead (the base frozen)."""
    text = text_config(config)
    return _profile(type(text), text.to_json_string(use_diff=False), dtype,
                    None if trains is None else frozenset(trains), lora, device_type)


def lora_spec_of(model: torch.nn.Module) -> LoraSpec | None:
    """The adapters a (peft) model carries, as the trace takes them; None without adapters."""
    modules, rank, dropout = set(), 0, 0.0
    for name, module in model.named_modules():
        adapters = getattr(module, "lora_A", None)
        if not isinstance(adapters, torch.nn.ModuleDict) or not adapters:
            continue
        inner = in_layer_name(name + ".weight")
        if inner is None:
            continue
        modules.add(inner[: -len(".weight")])
        key = next(iter(adapters))
        rank = max(rank, int(module.r[key]))
        drop = module.lora_dropout[key]
        dropout = max(dropout, float(getattr(drop, "p", 0.0)))
    return LoraSpec(tuple(sorted(modules)), rank, dropout) if modules else None


def model_profile(model: torch.nn.Module, device_type: str = "cpu") -> ActivationProfile:
    """The traced profile of a live model as it is set to train: its dtype, adapters or trainable weights."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    lora = lora_spec_of(model)
    trains = None if lora else frozenset(n for n in (in_layer_name(k) for k, p in model.named_parameters()
                                                      if p.requires_grad) if n)
    return activation_profile(model.config, dtype, trains=trains, lora=lora, device_type=device_type)
