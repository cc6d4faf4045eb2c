"""LoRA students through peft: which modules get adapters, and checkpoints that hold both forms.

`target_modules: auto` puts adapters on every linear layer of the text decoder's layers (attention and MLP
projections: q/k/v/o, gate/up/down in Qwen, Llama, Gemma, InternVL's and SmolVLM's language models), found
by name with the same rule the merger uses for the decoder stack, so the vision tower and its projector stay
frozen in every family. A list of names picks modules whose name ends with one of them.

A LoRA checkpoint folder holds the merged full weights (W + scale * B A, loadable by
AutoModelForImageTextToText like any checkpoint, so evaluation, merging and vLLM read it unchanged) and the
adapter itself under `adapter/` (peft's adapter_model.safetensors and adapter_config.json).
The KL reference of a LoRA run is the same model with its adapters disabled: no second copy in memory.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from protege.errors import UserFacingError
from protege.models.layer_names import LayoutError, decoder_stack, split_layer_name

ADAPTER_DIR = "adapter"
AUTO = "auto"


def linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def lora_targets(model: nn.Module, target_modules: str | list[str]) -> list[str]:
    """Full names of the linear modules that get adapters; UserFacingError when the setting names none."""
    names = linear_names(model)
    if target_modules == AUTO:
        params = [n for n, _ in model.named_parameters()]
        try:
            prefix, _ = decoder_stack(params, model.config.to_dict())
        except LayoutError as exc:
            raise UserFacingError(f"model.lora.target_modules auto: {exc}; list the module names instead") from None
        chosen = [n for n in names if (split_layer_name(n + ".weight") or None) is not None
                  and split_layer_name(n + ".weight").prefix == prefix]
    else:
        wanted = list(target_modules)
        chosen = [n for n in names if any(n == w or n.endswith("." + w) for w in wanted)]
        unmatched = [w for w in wanted if not any(n == w or n.endswith("." + w) for n in names)]
        if unmatched:
            short = sorted({n.rsplit(".", 1)[-1] for n in names})
            raise UserFacingError(f"model.lora.target_modules: {unmatched} name no linear module of "
                                  f"{type(model).__name__}; its linear modules end with {short}")
    if not chosen:
        raise UserFacingError(f"model.lora.target_modules {target_modules!r} matched no linear module of "
                              f"{type(model).__name__}")
    return chosen


def add_lora(model: nn.Module, rank: int, alpha: float, dropout: float, target_modules: str | list[str]):
    """The model wrapped with fresh adapters (peft), only the adapters trainable."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=lora_targets(model, target_modules), bias="none")
    return get_peft_model(model, config)


def is_lora(model: nn.Module) -> bool:
    try:  # the vLLM environment runs protege without peft: nothing there has adapters
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The base model's forward (the KL reference of a LoRA run)."""
    with model.disable_adapter():
        yield model


@torch.no_grad()
@torch.no_grad()
def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights W + scale * B A under the base model's own names, on the CPU, computed beside the
    training model (which keeps its adapters unmerged, so training goes on bit for bit). Merged one tensor at a
    time and moved to the host at once: a model on a GPU never holds a second copy of itself there (at 7B, ~15
    GB while a vLLM engine may be awake beside it)."""
    return {name: tensor.to("cpu", copy=True) for name, tensor in iter_merged_weights(model)}


@torch.no_grad()
def merged_adapted_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """W + scale * B A of the adapted modules only, under the base model's names (what a LoRA step changes:
    GTR-Turbo's merged teacher merges these, so it merges the adapters' task vectors, not their factors)."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, module in model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
            out[f"{name}.weight"] = (weight + delta.to(weight.dtype)).detach()
    return out


@torch.no_grad()
def iter_merged_weights(model: nn.Module):
    """(name, tensor) of the model's full weights one at a time, as a checkpoint names them: a plain model's own
    tensors (no copy), a LoRA model's base weights with each adapted weight merged (W + scale * B A) only when
    its turn comes, so at most one merged tensor exists beside the model."""
    if not is_lora(model):
        for name, t in model.state_dict().items():
            yield name, t.detach()
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {f"{name}.base_layer.weight": module for name, module in base.named_modules()
               if isinstance(module, LoraLayer)}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        module = adapted.get(key)
        if module is None:
            yield clean, value.detach()
        else:
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
            yield clean, (value + delta.to(value.dtype)).detach()


def plain_copy(model: nn.Module) -> nn.Module:
    """A frozen copy without adapters: the merged weights in the base model's own class."""
    import copy

    return copy.deepcopy(model).merge_and_unload().eval().requires_grad_(False)


def save_lora_checkpoint(model: nn.Module, folder: Path) -> None:
    """The merged full weights (config included) and the adapter under `adapter/`."""
    folder = Path(folder)
    base = model.get_base_model()
    base.save_pretrained(str(folder), state_dict=merged_state_dict(model), safe_serialization=True)
    model.save_pretrained(str(folder / ADAPTER_DIR), safe_serialization=True)
