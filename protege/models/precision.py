"""Mixed precision: `model.dtype: bfloat16` keeps the weights in bf16 and runs every forward of the model under
bf16 autocast where the device computes in bf16 natively (CUDA with bf16 support; CPUs with AVX512-BF16 or
AMX), so parts kept in float32 (LoRA adapters) meet bf16 activations in bf16 matmuls. Where bf16 is not
native the forward runs as it is: bf16 weights, no autocast. A module may name submodules that stay float32
whatever the model's dtype (`keep_in_float32`, the discriminator's head): they compute in fp32 themselves.

Training does not step the bf16 weights directly: the updaters (runtime/updaters.py) keep fp32 master
weights of the trainable bf16 parameters and hand the model each step's result rounded to bf16, so the
updates below bf16's half-ulp (most of them at lr 1e-5) are not rounded away.

The autocast is bound to the module's own `forward`, so generation, deep copies (the frozen reference, the
merged teacher) and peft wrappers all inherit it without each loop opening a context of its own.
"""
from __future__ import annotations

import contextlib
import functools
import types

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@functools.cache
def bf16_native(device_type: str) -> bool:
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def _autocast_forward(forward):
    @functools.wraps(forward)
    def wrapped(self, *args, **kwargs):
        param = next(self.parameters(), None)
        device_type = param.device.type if param is not None else "cpu"
        if not bf16_native(device_type):
            return forward(self, *args, **kwargs)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(self, *args, **kwargs)
    wrapped.bf16_autocast = True
    return wrapped


def enable_bf16_autocast(model: nn.Module) -> nn.Module:
    """Binds a bf16-autocast forward to `model` (idempotent); returns it."""
    if getattr(model.forward, "bf16_autocast", False):
        return model
    model.forward = types.MethodType(_autocast_forward(type(model).forward), model)
    return model


def autocast_like(model: nn.Module):
    """The autocast the model's own forward runs under, for a module of it called on its own (the LM head on
    chunks of hidden states): bf16 autocast where the model (or the model a peft wrapper holds) has it and the
    device computes bf16 natively; else nothing."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else None
    if not any(getattr(m.forward, "bf16_autocast", False) for m in (model, inner) if m is not None):
        return contextlib.nullcontext()
    param = next(model.parameters(), None)
    device_type = param.device.type if param is not None else "cpu"
    if not bf16_native(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16)


def float32_compute(tensor: torch.Tensor):
    """A context in which ops on `tensor`'s device compute in its dtype: autocast (bf16) off, if it was on."""
    device_type = tensor.device.type
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def with_precision(model: nn.Module, dtype_name: str) -> nn.Module:
    """`model` as `model.dtype` asks: bf16 weights and autocast forwards (the submodules the model names in
    `keep_in_float32` stay float32), or float32 untouched."""
    if dtype_name == "bfloat16":
        # their values as they are: a round trip through bf16 would round them
        kept = {name: {k: v.detach().float().clone() for k, v in model.get_submodule(name).state_dict().items()}
                for name in getattr(model, "keep_in_float32", ())}
        model.to(torch.bfloat16)
        for name, state in kept.items():
            model.get_submodule(name).float().load_state_dict(state)
        enable_bf16_autocast(model)
    return model
