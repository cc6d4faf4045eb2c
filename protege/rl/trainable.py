"""Which parameters an RL update trains (RIL Table 5c: attention + embeddings + LM head by default)."""
from __future__ import annotations

from torch import nn

GROUPS = {
    "all": lambda name: True,
    "attention": lambda name: "self_attn" in name or ".attn." in name,
    "attention+embeddings+head": lambda name: ("self_attn" in name or ".attn." in name
                                               or "embed_tokens" in name or "lm_head" in name),
}


def select_trainable(model: nn.Module, group: str) -> list[nn.Parameter]:
    if group == "lora":  # peft has left exactly the adapters trainable
        from protege.models.lora import is_lora

        if not is_lora(model):
            raise ValueError("trainable 'lora' needs a model with adapters (protege.models.lora.add_lora)")
        return [p for p in model.parameters() if p.requires_grad]
    if group not in GROUPS:
        raise ValueError(f"unknown trainable group {group!r}; expected one of {sorted(GROUPS)}")
    chosen = []
    for name, p in model.named_parameters():
        p.requires_grad_(GROUPS[group](name))
        if p.requires_grad:
            chosen.append(p)
    if not chosen:
        raise ValueError(f"trainable group {group!r} matched no parameter of {type(model).__name__}")
    return chosen
