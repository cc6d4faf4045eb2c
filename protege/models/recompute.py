"""Whether a model recomputes its activations in the backward pass (gradient checkpointing)."""
from __future__ import annotations


def recomputes(model) -> bool:
    # transformers 5 names it is_activation_checkpointing (is_gradient_checkpointing warns it is going away)
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))
