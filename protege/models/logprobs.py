"""Log-probs of chosen tokens without a [N, L, V] tensor: the model runs with logits_to_keep=1, and its final
hidden states at the scored positions go through the LM head in chunks of LOGIT_CHUNK_BYTES of float32
logits, recomputed in the backward pass instead of kept. A 152k vocabulary makes a whole batch's float32
log-softmax the largest tensor of an RL step; here a forward's memory is its activations.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from protege.models.precision import autocast_like

# float32 logits of one chunk of scored positions (the softmax and its product need about as much again each):
# a 152k vocabulary gives chunks of about 440 positions
LOGIT_CHUNK_BYTES = 256 << 20


def _apply_head(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden), also where ZeRO-3 partitions a frozen head (LoRA, attention-only training). Recomputed in
    the backward pass, a frozen head's module call would meet the empty shard DeepSpeed leaves it outside a
    forward (it re-gathers only parameters that take gradients), so its weight is gathered here and a copy kept
    for this chunk's backward (one head's size, for one chunk at a time)."""
    weight = getattr(head, "weight", None)
    if weight is None or getattr(weight, "ds_id", None) is None or weight.requires_grad:
        return head(hidden)
    import deepspeed

    bias = getattr(head, "bias", None)
    with deepspeed.zero.GatheredParameters([p for p in (weight, bias) if p is not None]):
        w = weight.detach().clone()
        b = None if bias is None else bias.detach().clone()
    return torch.nn.functional.linear(hidden, w, b)


def head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                  with_entropy: bool, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [K, H] at K scored positions, targets: [K] -> (log pi of the target [K], entropy [K]; zeros when
    not asked for), through the LM head in float32, at `temperature` (the distribution a sampler at that
    temperature draws from). The entropy is a metric, computed without a graph: under the backward pass's
    recompute a graph of it would keep each chunk's [K, V] softmax alive to the end."""
    logits = _apply_head(head, hidden).float()
    logp_all = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)  # [K, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else torch.zeros_like(logp)
    return logp, entropy


def forward_hidden(model, inputs: dict):
    """The last hidden state at every position [N, T, H], and the LM head it turns into logits through; the
    model's own logits only for the last position (logits_to_keep=1). (None, None) when the head alone does
    not reproduce the model's logits (a family that scales or caps them after the head)."""
    head = model.get_output_embeddings()
    # the last position by index, not `logits_to_keep=1`: the head then meets a fresh [N, 1, H] tensor, where a
    # strided slice of the hidden states sends a CPU bf16 linear through a copy of the whole head (~20 s at a
    # 152k vocabulary and 3584 wide)
    last_index = torch.tensor([inputs["input_ids"].shape[1] - 1], device=inputs["input_ids"].device)
    try:
        out = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=last_index)
    except (TypeError, IndexError):  # a forward without logits_to_keep, or one taking a count only
        try:
            out = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        except TypeError:
            return None, None
    last = out.hidden_states[-1]  # [N, T, H], after the final norm
    if head is None or out.logits.shape[1] != 1:
        return None, None
    with torch.no_grad(), autocast_like(model):  # checked on every forward: it costs one position per row
        mine = head(last[:, -1]).float()
        theirs = out.logits[:, -1].float()
        scale = float(theirs.nan_to_num(0.0, 0.0, 0.0).abs().max().clamp(min=1))
        if not torch.allclose(mine, theirs, rtol=1e-3, atol=1e-3 * scale, equal_nan=True):
            return None, None
    return last, head


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = False):
    """logits [N, L, V] predicting targets [N, L] -> log pi of each target [N, L] (and the entropy [N, L])."""
    logp_all = torch.log_softmax(logits.float(), dim=-1)  # [N, L, V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def scored_positions(model, inputs: dict, start: int, keep: torch.Tensor, *, with_entropy: bool = False,
                     with_hidden: bool = False, temperature: float = 1.0):
    """log pi(x_{t+1} | x_<=t) for t = start .. T-2 where `keep` [N, L] (L = T - 1 - start) is set, 0 elsewhere:
    (logp [N, L] float32, entropy [N, L] or None (detached), hidden [N, L, H] or None), at `temperature`."""
    targets_all = inputs["input_ids"][:, start + 1:]  # [N, L]
    last, head = forward_hidden(model, inputs)
    if last is None:  # the model's own logits, whole (a family whose head alone does not give them)
        out = model(**inputs, use_cache=False, output_hidden_states=with_hidden)
        logp, entropy = logprobs_from_logits(out.logits[:, start:-1] / temperature, targets_all, with_entropy=True)
        hidden = out.hidden_states[-1][:, start:-1] if with_hidden else None
        return logp * keep, (entropy * keep).detach() if with_entropy else None, hidden
    hidden = last[:, start:-1]  # [N, L, H]
    h, targets = hidden[keep], targets_all[keep]  # [K, H], [K]
    # out_features: under ZeRO-3 the head's weight is this rank's partition (often empty) outside a forward
    vocab = getattr(head, "out_features", None) or getattr(head.weight, "ds_shape", head.weight.shape)[0]
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))
    pieces = []
    with autocast_like(model):  # the head under the autocast the model's own forward uses (bf16 models)
        for c in range(0, h.shape[0], chunk):
            args = (head, h[c:c + chunk], targets[c:c + chunk], with_entropy, temperature)
            pieces.append(checkpoint(head_logprobs, *args, use_reentrant=False) if torch.is_grad_enabled()
                          else head_logprobs(*args))
    N, L = keep.shape
    logp = torch.zeros(N, L, dtype=torch.float32, device=h.device)
    entropy = torch.zeros(N, L, dtype=torch.float32, device=h.device) if with_entropy else None
    if pieces:
        logp = logp.index_put((keep,), torch.cat([p[0] for p in pieces]))
        if with_entropy:
            entropy = entropy.index_put((keep,), torch.cat([p[1] for p in pieces]))
    return logp, entropy, hidden if with_hidden else None
