"""Micro-batches: how many rows one forward of a training or scoring pass holds.

A step's batch (an RL group of 256 answers, a PPO batch of episodes, an SFT batch) is split into contiguous
runs of rows whose padded tokens fit a budget; each run is one forward (and backward), the gradients add up,
and the optimizer steps once. Every loss is written as each micro-batch's share of the whole batch's loss,
so the sum over micro-batches is the whole-batch loss and its gradient, whatever the split.

The budget is `micro_batch_tokens` where a section sets it; left unset it is derived from the model (per-token
activation memory traced from its own layers, protege.models.activations) and the memory there is for activations: a
fixed share of the accelerator, or ACTIVATION_BYTES_CPU on the CPU. The LM head's logits never count against
it: log-probs come from chunks of scored positions (rollout.trajectory.score).
"""
from __future__ import annotations

import torch

from protege.models.activations import ActivationProfile, model_profile, text_config
from protege.models.recompute import recomputes

# what the derived budget lets one forward's activations take
ACTIVATION_BYTES_CPU = 2 << 30
ACTIVATION_SHARE_GPU = 0.25  # of the device's memory: weights, gradients, optimizer state and KV cache share the rest
# a family the meta-device trace cannot build (remote code): about this many values per hidden unit per layer
# (a Llama-style layer keeps 30-45 in bf16: benchmarks/plan_calibration.py)
FALLBACK_VALUES_PER_HIDDEN = 45


def text_shape(config) -> tuple[int, int, int]:
    """(hidden size, layers, vocabulary) of a model config (the text model's, for a VLM)."""
    text = text_config(config)
    hidden = getattr(text, "hidden_size", None) or getattr(text, "d_model", None) or getattr(text, "n_embd", 0)
    layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", 0)
    vocab = getattr(text, "vocab_size", None) or getattr(config, "vocab_size", 0)
    return int(hidden), int(layers), int(vocab)


def fallback_profile(config, dtype_bytes: int) -> ActivationProfile:
    hidden, layers, _ = text_shape(config)
    per_layer = FALLBACK_VALUES_PER_HIDDEN * hidden * dtype_bytes
    return ActivationProfile(per_layer=per_layer, layer_input=hidden * dtype_bytes, outside=4 * hidden,
                             largest=per_layer // 4, layers=layers)


def training_bytes_per_token(model: torch.nn.Module, device: torch.device | None = None) -> int:
    """Memory one token's activations hold at the peak of this model's forward and backward, as it is set to
    train (its dtype, adapters or trainable weights, recompute): protege.models.activations' trace."""
    device_type = device.type if device is not None else "cpu"
    try:
        profile = model_profile(model, device_type)
    except Exception:  # noqa: BLE001 - a family the meta device cannot build: the fallback rule
        dtype = next((p.dtype for p in model.parameters()), torch.float32)
        profile = fallback_profile(model.config, torch.finfo(dtype).bits // 8)
    return profile.training(recomputes(model))


def activation_budget(device: torch.device | None) -> int:
    if device is not None and device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * ACTIVATION_SHARE_GPU)
    return ACTIVATION_BYTES_CPU


def budget_tokens(setting: int | None, model: torch.nn.Module, device: torch.device | None = None) -> int:
    """Tokens per micro-batch: the setting, or the derived budget for this model on this device."""
    if setting is not None:
        return setting
    return max(1, activation_budget(device) // max(training_bytes_per_token(model, device), 1))


def micro_batches(rows: int, width: int, tokens: int) -> list[range]:
    """Contiguous row ranges covering `rows` rows of `width` tokens, each within `tokens` (one row at least)."""
    per = max(1, tokens // max(width, 1))
    return [range(i, min(i + per, rows)) for i in range(0, rows, per)]


# what one more forward and backward costs beyond its tokens, in tokens' worth of work (the per-layer launches
# and the vision tower's fixed share): a split into shorter micro-batches must save more padding than this.
# benchmarks/warm_start_step.py on the tiny student, 1 CPU thread: 0 splits a 32-row batch into ~10 forwards
# and is 1.2-2.6x slower than one forward; 256-1024 are within noise of each other
FORWARD_OVERHEAD_TOKENS = 512
# above this many rows the exact split's O(rows^2) search gives way to filling the budget in length order
EXACT_SPLIT_ROWS = 512


def length_groups(lengths: list[int], tokens: int, overhead: int = FORWARD_OVERHEAD_TOKENS) -> list[list[int]]:
    """Rows (by index) grouped into micro-batches by length: each group is padded only to its own longest row
    (Trajectory.trimmed) and holds at most `tokens` padded tokens (one row at least). The rows are sorted by
    length and cut where the padded tokens plus `overhead` per forward are least, so a batch whose rows differ
    in length stops paying the longest row's width on every row. Whatever the grouping, the losses are
    shares of the whole batch's, so the gradient is the same up to the order of float sums."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    if n == 0:
        return []
    sizes = [max(1, lengths[i]) for i in order]
    if n > EXACT_SPLIT_ROWS:
        groups, cur = [], []
        for i, size in zip(order, sizes):
            if cur and (len(cur) + 1) * size > tokens:
                groups.append(cur)
                cur = []
            cur.append(i)
        return groups + [cur]
    # best[j]: least cost of the first j sorted rows; cut[j]: where the last group of that best split starts
    best, cut = [0] + [None] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        width = sizes[j - 1]  # the longest row of any group ending at j
        for i in range(j - 1, -1, -1):
            if j - i > 1 and (j - i) * width > tokens:
                break
            cost = best[i] + (j - i) * width + overhead
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def split_to(groups: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """`groups` with the ones of most padded tokens halved (in length order) until there are `count` of them."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        splittable = [g for g in groups if len(g) > 1]
        if not splittable:
            break
        big = max(splittable, key=lambda g: len(g) * max(lengths[i] for i in g))
        ordered = sorted(big, key=lambda i: (lengths[i], i))
        at = groups.index(big)
        groups[at:at + 1] = [ordered[:len(ordered) // 2], ordered[len(ordered) // 2:]]
    return groups


def rank_length_groups(lengths: list[int], tokens: int, agree: bool) -> list[list[int]]:
    """length_groups, and with `agree` (DeepSpeed over several ranks: a ZeRO-3 forward gathers the weights and
    a ZeRO-2 backward reduces the gradients, both collectives) as many groups on every rank: the ranks with fewer split their largest ones. Collective when
    `agree`; a rank with fewer rows than the others' forwards is refused on every rank alike."""
    groups = length_groups(lengths, tokens)
    if not agree:
        return groups
    from protege.errors import UserFacingError
    from protege.runtime.distributed import all_reduce_max

    most, least_rows = (int(v) for v in all_reduce_max(torch.tensor([len(groups), -len(lengths)])))
    if -least_rows < most:
        raise UserFacingError(f"DeepSpeed runs as many forwards on every rank: one rank has {-least_rows} rows "
                              f"for {most} forwards; raise micro_batch_tokens or the rows per step")
    return split_to(groups, lengths, most)
