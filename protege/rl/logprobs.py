"""Per-token log-probabilities of completions under a model."""
from __future__ import annotations

import torch

from protege.generation.transformers_backend import Completions

VISION_KEYS = ("pixel_values", "image_grid_thw")


def repeat_vision(batch: dict[str, torch.Tensor], times: int) -> dict[str, torch.Tensor]:
    """Vision inputs for prompts repeated `times` in a row (as generate(num_return_sequences) lays them out).

    A prompt may hold several images: its images repeat together, in order, once per copy of the prompt.
    """
    if "image_grid_thw" not in batch:  # text-only prompts
        return {}
    grid = batch["image_grid_thw"]  # [I, 3], one row per image, prompts' images in order
    per_image = grid.prod(dim=1)  # patches per image
    patches = batch["pixel_values"].split(per_image.tolist())  # I tensors [patches_i, D]
    tokens = batch["mm_token_type_ids"].sum(dim=1).tolist()  # image tokens of each prompt  [B]
    merge = int(per_image.sum()) // max(1, sum(tokens))  # patches per image token (merge_size ** 2)
    owned, i = [], 0
    for n in tokens:  # the images of each prompt: consume images until its image tokens are covered
        start = i
        while n > 0:
            n -= int(per_image[i]) // merge
            i += 1
        owned.append(list(range(start, i)))
    order = [j for images in owned for _ in range(times) for j in images]
    return {"pixel_values": torch.cat([patches[j] for j in order]), "image_grid_thw": grid[order]}


def completion_logprobs(model, c: Completions, vision: dict[str, torch.Tensor], image_token_id: int,
                        pad_id: int, with_entropy: bool = False):
    """log pi(o_t | q, o_<t) for every completion position: [N, L] (and entropy [N, L] if asked)."""
    seq = c.sequences  # [N, P + L]
    prompt_mask = (seq[:, :c.prompt_len] != pad_id).long()
    attn = torch.cat([prompt_mask, c.completion_mask], dim=1)
    out = model(input_ids=seq, attention_mask=attn, mm_token_type_ids=(seq == image_token_id).long(),
                **vision, use_cache=False)
    logits = out.logits[:, c.prompt_len - 1:-1].float()  # [N, L, V]: position t predicts token t+1
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, seq[:, c.prompt_len:].unsqueeze(-1)).squeeze(-1)  # [N, L]
    if not with_entropy:
        return logp
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [N, L]
    return logp, entropy
