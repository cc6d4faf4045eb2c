"""Where the decoder layers are in a checkpoint's tensor names, without architecture tables.

mergekit knows each architecture from a JSON table (pre_weights, a layer template, post_weights). protege reads
the names instead:

- a *layer stack* is every tensor whose name has a component `layers|layer|h|blocks|block` followed by an
  index: `model.layers.3.mlp.up_proj.weight` is layer 3 of the stack `model.layers.`; `transformer.h.0.attn.w`,
  `model.language_model.layers.7.x` and `visual.blocks.2.attn.qkv.weight` (a vision tower) are too;
- the *text decoder* is the one stack whose prefix names no vision / audio part (`visual`, `vision`, ...), so a
  VLM's vision tower blocks are never sliced (mergekit's qwen2_vl table indexes `model.layers.` for its
  text_decoder module too); when several stacks remain, the one whose layer count is the config's
  num_hidden_layers (top level or text_config) wins;
- every other tensor is a *pre* weight (embeddings, the vision tower and its projector: anything not after the
  decoder) or a *post* weight: an output head (`lm_head`, `embed_out`, `output`, `score`, `classifier`, ...) or
  a norm directly under the decoder's parent (`model.norm`, `transformer.ln_f`, `model.final_layernorm`),
  which is how mergekit's tables split every decoder they list.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

# the component that holds a layer index: `layers.3.`, `layer.3.` (BERT), `h.3.` (GPT-2), `blocks.3.` / `block.3.`
LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)(?=\.|$)")
# prefix words of stacks that are not the text decoder (a VLM's vision tower, an audio encoder, a projector)
NON_TEXT_WORDS = ("visual", "vision", "image", "img", "audio", "speech", "projector", "multi_modal", "merger",
                  "perceiver", "resampler")
# output heads: a tensor with one of these components comes after the decoder (mergekit's post_weights)
HEAD_COMPONENTS = {"lm_head", "embed_out", "output_layer", "score", "classifier"}
HEAD_ROOTS = {"output"}  # InternLM2's `output.weight`: a head only as the first component


@dataclass(frozen=True)
class LayerName:
    """`model.layers.3.mlp.up_proj.weight` = prefix `model.layers.` + index 3 + suffix `mlp.up_proj.weight`."""
    prefix: str
    index: int
    suffix: str

    def renumbered(self, index: int) -> str:
        return f"{self.prefix}{index}" + (f".{self.suffix}" if self.suffix else "")


def split_layer_name(name: str) -> LayerName | None:
    """The first layer index in a tensor name (so an expert's index inside a layer is part of the suffix)."""
    m = LAYER_RE.search(name)
    if m is None:
        return None
    return LayerName(name[:m.start(1)], int(m.group(1)), name[m.end(1) + 1:])


def layer_stacks(names: Iterable[str]) -> dict[str, int]:
    """prefix -> number of layers (largest index + 1) of every stack in the names, in first-seen order."""
    stacks: dict[str, int] = {}
    for name in names:
        ln = split_layer_name(name)
        if ln is not None:
            stacks[ln.prefix] = max(stacks.get(ln.prefix, 0), ln.index + 1)
    return stacks


def is_text_stack(prefix: str) -> bool:
    low = prefix.lower()
    return not any(word in low for word in NON_TEXT_WORDS)


def config_layer_counts(config: dict | None) -> set[int]:
    """num_hidden_layers at the top level of config.json and in its text sub-configs (text_config, ...)."""
    if not isinstance(config, dict):
        return set()
    found = set()
    for scope in text_config_scopes(config):
        value = scope.get("num_hidden_layers")
        if isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
    return found


def text_config_scopes(config: dict) -> list[dict]:
    """The dicts of config.json that describe the text decoder: the top level and text_config-like children
    (text_config, language_config, llm_config, ...). A vision_config's num_hidden_layers is never touched."""
    scopes = [config]
    for key, value in config.items():
        if isinstance(value, dict) and any(word in key.lower() for word in ("text", "language", "llm")):
            scopes.append(value)
    return scopes


class LayoutError(ValueError):
    """The names do not show one text decoder; the message says what was found."""


def decoder_stack(names: Iterable[str], config: dict | None = None) -> tuple[str, int]:
    """(prefix, number of layers) of the text decoder; LayoutError when there is none or no single one."""
    stacks = layer_stacks(names)
    text = {p: n for p, n in stacks.items() if is_text_stack(p)}
    if len(text) == 1:
        return next(iter(text.items()))
    if not text:
        seen = f" (only {', '.join(stacks)}, which look like vision or audio stacks)" if stacks else ""
        raise LayoutError(f"no decoder layers found: expected tensor names such as model.layers.<i>.{seen}")
    counts = config_layer_counts(config)
    matching = {p: n for p, n in text.items() if n in counts}
    if len(matching) == 1:
        return next(iter(matching.items()))
    listed = ", ".join(f"{p}<i> ({n} layers)" for p, n in text.items())
    raise LayoutError(f"several layer stacks could be the text decoder: {listed}; protege slices one decoder "
                      f"and could not tell which from config.json's num_hidden_layers")


def is_post_weight(name: str, decoder_prefix: str) -> bool:
    """True for the weights mergekit plans after the layers: output heads and the decoder's final norm."""
    parts = name.split(".")
    if parts[0] in HEAD_ROOTS or HEAD_COMPONENTS.intersection(parts[:-1] or parts):
        return True
    stem = decoder_prefix.rstrip(".")
    parent = stem[:stem.rfind(".") + 1] if "." in stem else ""  # "model.layers." -> "model."
    if not name.startswith(parent):
        return False
    module = name[len(parent):].split(".", 1)[0].lower()
    # a norm beside the layer stack closes the decoder; an embedding norm (LFM2's embedding_norm) opens it
    return (module == "ln_f" or "norm" in module) and "embed" not in module
