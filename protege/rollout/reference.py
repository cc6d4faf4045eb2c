"""The KL reference policy's forward, wherever its weights live."""
from __future__ import annotations

import contextlib

from protege.models.lora import adapters_disabled
from protege.runtime.placement import visiting


@contextlib.contextmanager
def reference(policy, ref, device, offload: bool):
    """pi_ref for the KL term: the frozen SFT model (moved in when offloaded), or the LoRA policy with its
    adapters disabled (no second copy of the weights)."""
    if ref is None:
        with adapters_disabled(policy) as base:
            yield base
    else:
        with visiting(ref, device, offload):
            yield ref
