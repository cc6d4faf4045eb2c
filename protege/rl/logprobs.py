"""Per-token log-probabilities of completions under a model."""
from __future__ import annotations

import torch

from protege.generation.transformers_backend import Completions


def completion_logprobs(model, c: Completions, prompt_inputs: dict[str, torch.Tensor], processor,
                        with_entropy: bool = False):
    """log pi(o_t | q, o_<t) for every completion position: [N, L] (and entropy [N, L] if asked).

    prompt_inputs: the model inputs of the N prompts (row i is the prompt of completion i, left-padded to P),
    whose vision inputs and per-token inputs carry over to prompt + completion."""
    seq = c.sequences  # [N, P + L]
    inputs = processor.extend_inputs(prompt_inputs, seq, c.completion_mask)
    out = model(**inputs, use_cache=False)
    logits = out.logits[:, c.prompt_len - 1:-1].float()  # [N, L, V]: position t predicts token t+1
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, seq[:, c.prompt_len:].unsqueeze(-1)).squeeze(-1)  # [N, L]
    if not with_entropy:
        return logp
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [N, L]
    return logp, entropy
