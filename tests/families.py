"""Tiny random checkpoints of real transformers vision-language families, built offline.

`build_family(name, out)` writes an ordinary Hugging Face folder, as a user's `save_pretrained` would leave
it: config.json, model.safetensors and generation_config.json from `model.save_pretrained(...,
safe_serialization=True)`, the tokenizer's files (tokenizer.json, tokenizer_config.json), the image
processor's preprocessor_config.json, a processor_config.json naming the processor class with its init
kwargs, and chat_template.jinja. Nothing is downloaded: the tokenizer is a small byte-level BPE trained
here on the world's text, with the family's own special tokens; the weights are random (seeded).

Each family keeps its real architecture, processor and prompt format (turn markers, image placeholders,
end-of-turn token), at toy size: a text model of hidden size 64 with 2 layers, a vision tower of hidden
size 32 with 1-2 layers, and an image processor set so that one 64x64 world image becomes a few (16-36)
image tokens. Every model has well under 1M parameters. The chat templates are simplified ones written in
each family's style, not copies of the real ones.
"""
from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# text tower (all families): hidden 64, 4 heads of 16, 2 kv heads, 2 layers
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN = 64, 4, 2, 16, 2, 128
# vision tower: hidden 32, 2 heads of 16
V_HIDDEN, V_HEADS, V_FFN = 32, 2, 64
INIT_RANGE = 0.1  # tiny models need a larger init than the usual 0.02 to learn at all
BPE_MERGES = 160  # learned tokens on top of the 256 bytes and the family's special tokens


@dataclass(kw_only=True)
class Spec:
    """Everything one family's folder needs besides the weights, and what the tests expect of it."""

    processor_class: str
    specials: list[str]  # every special token, in id order (they take the first ids)
    named: dict[str, str]  # tokenizer attributes: bos/eos/pad/unk and the model-specific ones (image_token, ...)
    chat_template: str
    image_processor: object
    processor_kwargs: dict
    make_config: Callable[[Callable[[str], int], int], object]  # (token id of, vocab size) -> model config
    end_of_turn: str  # the token that ends an assistant turn (generation stops there)
    extra_eos: list[str] = field(default_factory=list)  # other tokens generation stops at
    placeholder: str  # what the chat template writes for an image
    generation_prompt: str  # what add_generation_prompt appends
    feature_token: str  # the token the processor repeats once per image feature (the config's image token)
    image_tokens: int  # feature tokens per image_size x image_size image
    post_init: Callable[[object], None] | None = None  # weight changes after the family's own init (seeded)


# ------------------------------------------------------------------------------------------ tokenizer

@functools.lru_cache(maxsize=1)
def _world_texts() -> tuple[str, ...]:
    from protege.world.questions import make_item
    from protege.world.teachers import all_templates

    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    chat_words = ["system", "user", "assistant", "model", "User", "Assistant", "USER", "ASSISTANT",
                  "You are a helpful assistant."]
    return tuple([i.question for i in items] + [i.answer for i in items] + all_templates() * 5 + chat_words * 5)


def _tokenizer(spec: Spec):
    """A byte-level BPE (Qwen's split regex, as protege.models.tokenizer) with the family's special tokens
    taking the first ids; the named ones are tokenizer attributes saved in tokenizer_config.json."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from protege.models.tokenizer import QWEN_SPLIT

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + len(spec.specials) + BPE_MERGES, special_tokens=spec.specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_world_texts(), trainer)
    standard = {k: v for k, v in spec.named.items() if k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    model_specific = {k: v for k, v in spec.named.items() if k not in standard}
    # processor_class is saved in tokenizer_config.json, as a processor's save_pretrained does
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False,
                                   processor_class=spec.processor_class,
                                   extra_special_tokens=model_specific or None, **standard)
    fast.chat_template = spec.chat_template
    for token in spec.specials:
        assert fast.convert_tokens_to_ids(token) == spec.specials.index(token), token
    return fast


def _vocab_size(n: int) -> int:
    return -(-n // 64) * 64


# ------------------------------------------------------------------------------------------ templates
# Simplified templates in each family's style. The generation prompt is always a prefix of the rendered
# assistant turn, which then ends with the family's end-of-turn token.

def _content(image: str, video: str | None = None) -> str:
    """A message's content: a string, or parts in order (image placeholder, video placeholder, text)."""
    video_part = f"{{% elif part['type'] == 'video' %}}{video}" if video else ""
    return ("{% if message['content'] is string %}{{ message['content'] }}"
            "{% else %}{% for part in message['content'] %}"
            f"{{% if part['type'] == 'image' %}}{image}{video_part}"
            "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
            "{% endfor %}{% endif %}")


def _chatml(image: str, video: str, system: str | None = None) -> str:
    """Qwen's ChatML: <|im_start|>role\\n...<|im_end|>\\n; Qwen2-VL and Qwen2.5-VL add a default system turn."""
    default_system = ("{% if loop.first and message['role'] != 'system' %}"
                      f"<|im_start|>system\n{system}<|im_end|>\n{{% endif %}}") if system else ""
    return ("{% for message in messages %}" + default_system
            + "<|im_start|>{{ message['role'] }}\n" + _content(image, video) + "<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


QWEN_TEMPLATE = _chatml("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>",
                        system="You are a helpful assistant.")
QWEN3_TEMPLATE = _chatml("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>")
INTERNVL_TEMPLATE = _chatml("<IMG_CONTEXT>\n", "<video>\n")

# SmolVLM / Idefics3: <|im_start|>User:<image>question<end_of_utterance>\nAssistant: answer<end_of_utterance>\n
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is not string and message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    + _content("<image>") + "<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

# LLaVA-OneVision (Qwen2 inside): <|im_start|>user <image>\nquestion<|im_end|><|im_start|>assistant\nanswer<|im_end|>
LLAVA_OV_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% else %}<|im_start|>{{ message['role'] }} {% endif %}"
    "{% if message['content'] is string %}{% if message['role'] != 'assistant' %}{{ '\\n' }}{% endif %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'image') %}<image>{% endfor %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'video') %}<video>{% endfor %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% if message['role'] != 'assistant' %}{{ '\\n' }}{% endif %}{{ part['text'] }}{% endfor %}"
    "{% endif %}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# LLaVA-1.5 (Vicuna): USER: <image>\nquestion ASSISTANT: answer</s>
LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] if message['content'] is string "
    "else message['content'][0]['text'] }} "
    "{% elif message['role'] == 'assistant' %}ASSISTANT: "
    "{{ message['content'] if message['content'] is string else message['content'][0]['text'] }}{{ eos_token }}"
    "{% else %}USER: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'image') %}<image>\n{% endfor %}"
    "{% for part in message['content'] | selectattr('type', 'equalto', 'text') %}{{ part['text'] }}{% endfor %}"
    "{% endif %} {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

# Gemma 3: <bos><start_of_turn>user\n<start_of_image>question<end_of_turn>\n<start_of_turn>model\nanswer<end_of_turn>\n
# (a system message is put at the head of the first user turn, as Gemma has no system role)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system = (messages[0]['content'] if messages[0]['content'] is string "
    "else messages[0]['content'][0]['text']) + '\\n\\n' %}{% set messages = messages[1:] %}"
    "{% else %}{% set system = '' %}{% endif %}"
    "{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if loop.first %}{{ system }}{% endif %}"
    + _content("<start_of_image>") + "<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


# ------------------------------------------------------------------------------------------ families

def _text(**over) -> dict:
    """The text tower's config kwargs, shared by every family."""
    return dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, max_position_embeddings=2048, initializer_range=INIT_RANGE) | over


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>"]
QWEN_NAMED = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}


def _qwen(image_size: int, version: str) -> Spec:
    """Qwen2-VL, Qwen2.5-VL and Qwen3-VL: patch 8, 2x2 merge -> (64 / 8 / 2)^2 = 16 tokens a 64x64 image;
    M-RoPE sections sized for head_dim 16 (they add up to head_dim / 2)."""
    import transformers

    patch = 8
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = dict(num_heads=V_HEADS, patch_size=patch, spatial_merge_size=2, temporal_patch_size=2,
                  initializer_range=INIT_RANGE)
    if version == "2":  # embed_dim is the tower's width, hidden_size the merger's output (the text width)
        cls, template, processor_class = transformers.Qwen2VLConfig, QWEN_TEMPLATE, "Qwen2VLProcessor"
        vision |= dict(depth=1, embed_dim=V_HIDDEN, hidden_size=HIDDEN, mlp_ratio=V_FFN // V_HIDDEN)
    elif version == "2.5":
        cls, template, processor_class = transformers.Qwen2_5_VLConfig, QWEN_TEMPLATE, "Qwen2_5_VLProcessor"
        # window attention over 2x2 merged units (window_size is in pixels); the last block attends fully
        vision |= dict(depth=2, hidden_size=V_HIDDEN, intermediate_size=V_FFN, out_hidden_size=HIDDEN,
                       window_size=patch * 2 * 2, fullatt_block_indexes=[1])
    else:
        cls, template, processor_class = transformers.Qwen3VLConfig, QWEN3_TEMPLATE, "Qwen3VLProcessor"
        rope["mrope_interleaved"] = True
        vision |= dict(depth=2, hidden_size=V_HIDDEN, intermediate_size=V_FFN, out_hidden_size=HIDDEN,
                       num_position_embeddings=(image_size // patch) ** 2, deepstack_visual_indexes=[0])

    def config(tid, vocab):
        text = _text(vocab_size=vocab, bos_token_id=tid("<|endoftext|>"), eos_token_id=tid("<|im_end|>"),
                     pad_token_id=tid("<|endoftext|>"), rope_parameters=dict(rope))
        if version == "3":
            text["head_dim"] = HEAD_DIM
        return cls(text_config=text, vision_config=dict(vision), tie_word_embeddings=False,
                   image_token_id=tid("<|image_pad|>"), video_token_id=tid("<|video_pad|>"),
                   vision_start_token_id=tid("<|vision_start|>"), vision_end_token_id=tid("<|vision_end|>"))

    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pixels = image_size * image_size  # min = max pixels: every image is resized to the same grid
    ip = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                  size={"shortest_edge": pixels, "longest_edge": pixels})
    return Spec(processor_class=processor_class, specials=QWEN_SPECIALS, named=QWEN_NAMED, chat_template=template,
                image_processor=ip, processor_kwargs={}, make_config=config, end_of_turn="<|im_end|>",
                extra_eos=["<|endoftext|>"], placeholder="<|vision_start|><|image_pad|><|vision_end|>",
                generation_prompt="<|im_start|>assistant\n", feature_token="<|image_pad|>",
                image_tokens=(image_size // patch // 2) ** 2)


IDEFICS_SPECIALS = (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<end_of_utterance>", "<fake_token_around_image>",
                     "<image>", "<global-img>"]
                    + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])


def _idefics_like(image_size: int, smolvlm: bool) -> Spec:
    """SmolVLM2 (model_type smolvlm) and Idefics3 / SmolVLM v1 (model_type idefics3): SigLIP-style tower,
    pixel shuffle (scale factor 2), Llama text; image splitting off so a 64x64 image is one global tile."""
    from transformers import Idefics3Config, SmolVLMConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    patch, scale = 8, 2
    seq_len = (image_size // patch) ** 2 // scale ** 2
    specials = IDEFICS_SPECIALS + (["<video>"] if smolvlm else [])
    named = {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>", "pad_token": "<|im_end|>",
             "unk_token": "<|endoftext|>"}
    if smolvlm:  # SmolVLMProcessor reads these from the tokenizer, with these same defaults
        named |= {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                  "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
                  "video_token": "<video>"}
    ip_cls = SmolVLMImageProcessorPil if smolvlm else Idefics3ImageProcessorPil
    ip = ip_cls(do_image_splitting=False, size={"longest_edge": image_size},
                max_image_size={"longest_edge": image_size})
    cfg_cls = SmolVLMConfig if smolvlm else Idefics3Config

    def config(tid, vocab):
        return cfg_cls(
            text_config=dict(model_type="llama", **_text(vocab_size=vocab, head_dim=HEAD_DIM,
                                                        bos_token_id=tid("<|im_start|>"),
                                                        eos_token_id=tid("<end_of_utterance>"),
                                                        pad_token_id=tid("<|im_end|>"))),
            vision_config=dict(hidden_size=V_HIDDEN, intermediate_size=V_FFN, num_hidden_layers=1,
                               num_attention_heads=V_HEADS, image_size=image_size, patch_size=patch,
                               initializer_range=INIT_RANGE),
            scale_factor=scale, image_token_id=tid("<image>"), pad_token_id=tid("<|im_end|>"),
            tie_word_embeddings=False)

    return Spec(processor_class="SmolVLMProcessor" if smolvlm else "Idefics3Processor", specials=specials,
                named=named, chat_template=SMOLVLM_TEMPLATE, image_processor=ip,
                processor_kwargs={"image_seq_len": seq_len}, make_config=config, end_of_turn="<end_of_utterance>",
                placeholder="<image>", generation_prompt="Assistant:", feature_token="<image>", image_tokens=seq_len)


def _llava_onevision(image_size: int) -> Spec:
    from transformers import LlavaOnevisionConfig
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    # SigLIP tower at image_size, patch 16: 4x4 patches a tile; one pinpoint (the image size itself) makes
    # anyres a base tile plus one high-resolution tile: 16 + 4x4 + 4 newlines = 36 tokens
    patch = 16
    side = image_size // patch
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
    named = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "image_token": "<image>",
             "video_token": "<video>"}
    pinpoints = [[image_size, image_size]]
    ip = LlavaOnevisionImageProcessorPil(size={"height": image_size, "width": image_size},
                                         image_grid_pinpoints=pinpoints)

    def config(tid, vocab):
        return LlavaOnevisionConfig(
            text_config=dict(model_type="qwen2", **_text(vocab_size=vocab, bos_token_id=tid("<|endoftext|>"),
                                                        eos_token_id=tid("<|im_end|>"),
                                                        pad_token_id=tid("<|endoftext|>"))),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=V_HIDDEN, intermediate_size=V_FFN,
                               num_hidden_layers=1, num_attention_heads=V_HEADS, image_size=image_size,
                               patch_size=patch, vision_use_head=False),
            image_token_index=tid("<image>"), video_token_index=tid("<video>"), image_grid_pinpoints=pinpoints,
            vision_feature_select_strategy="full", vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9",
            tie_word_embeddings=False)

    return Spec(processor_class="LlavaOnevisionProcessor", specials=specials, named=named,
                chat_template=LLAVA_OV_TEMPLATE, image_processor=ip,
                processor_kwargs={"num_image_tokens": side * side, "vision_feature_select_strategy": "full",
                                  "image_token": "<image>", "video_token": "<video>",
                                  "vision_aspect_ratio": "anyres_max_9"},
                make_config=config, end_of_turn="<|im_end|>", extra_eos=["<|endoftext|>"],
                placeholder="<image>", generation_prompt="<|im_start|>assistant\n", feature_token="<image>",
                image_tokens=side * side * 2 + side)


def _internvl(image_size: int) -> Spec:
    from transformers import InternVLConfig
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    # one image_size tile (max_patches 1: no tiling, no thumbnail), patch 8, pixel shuffle 0.5 -> 16 tokens
    patch = 8
    seq_len = (image_size // patch) ** 2 // 4
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
    named = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "start_image_token": "<img>",
             "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
    ip = GotOcr2ImageProcessorPil(size={"height": image_size, "width": image_size}, crop_to_patches=False,
                                  min_patches=1, max_patches=1)

    def config(tid, vocab):
        return InternVLConfig(
            text_config=dict(model_type="qwen2", **_text(vocab_size=vocab, bos_token_id=tid("<|endoftext|>"),
                                                        eos_token_id=tid("<|im_end|>"),
                                                        pad_token_id=tid("<|endoftext|>"))),
            vision_config=dict(hidden_size=V_HIDDEN, intermediate_size=V_FFN, num_hidden_layers=1,
                               num_attention_heads=V_HEADS, image_size=[image_size, image_size],
                               patch_size=[patch, patch], initializer_range=INIT_RANGE),
            image_token_id=tid("<IMG_CONTEXT>"), image_seq_length=seq_len, downsample_ratio=0.5,
            vision_feature_layer=-1, vision_feature_select_strategy="default", tie_word_embeddings=False)

    return Spec(processor_class="InternVLProcessor", specials=specials, named=named, chat_template=INTERNVL_TEMPLATE,
                image_processor=ip, processor_kwargs={"image_seq_length": seq_len}, make_config=config,
                end_of_turn="<|im_end|>", extra_eos=["<|endoftext|>"], placeholder="<IMG_CONTEXT>\n",
                generation_prompt="<|im_start|>assistant\n", feature_token="<IMG_CONTEXT>", image_tokens=seq_len)


def _gemma3(image_size: int) -> Spec:
    from transformers import Gemma3Config
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    # SigLIP tower at image_size, patch 8 (8x8 patches), average-pooled to 4x4 = 16 soft tokens
    patch, per_image = 8, 16
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>"]
    named = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
             "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    ip = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size}, do_pan_and_scan=False)

    def config(tid, vocab):
        return Gemma3Config(
            text_config=_text(vocab_size=vocab, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM,
                              sliding_window=512, bos_token_id=tid("<bos>"), eos_token_id=tid("<eos>"),
                              pad_token_id=tid("<pad>")),
            vision_config=dict(hidden_size=V_HIDDEN, intermediate_size=V_FFN, num_hidden_layers=1,
                               num_attention_heads=V_HEADS, image_size=image_size, patch_size=patch,
                               vision_use_head=False),
            mm_tokens_per_image=per_image, boi_token_index=tid("<start_of_image>"),
            eoi_token_index=tid("<end_of_image>"), image_token_index=tid("<image_soft_token>"),
            initializer_range=INIT_RANGE, tie_word_embeddings=True)

    def projector(model):
        # Gemma 3 initializes its image projection to zeros (a pretrained tower is loaded over it); a random
        # checkpoint needs one that passes the image on, as any trained checkpoint's does
        import torch

        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, INIT_RANGE)

    return Spec(processor_class="Gemma3Processor", specials=specials, named=named, chat_template=GEMMA3_TEMPLATE,
                image_processor=ip, processor_kwargs={"image_seq_length": per_image}, make_config=config,
                end_of_turn="<end_of_turn>", extra_eos=["<eos>"], placeholder="<start_of_image>",
                generation_prompt="<start_of_turn>model\n", feature_token="<image_soft_token>",
                image_tokens=per_image, post_init=projector)


def _llava(image_size: int) -> Spec:
    from transformers import LlavaConfig
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    # CLIP tower at image_size, patch 16: 4x4 patches + CLS; the "default" strategy drops CLS -> 16 tokens
    patch = 16
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
    named = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
             "image_token": "<image>"}
    ip = LlavaImageProcessorPil(size={"shortest_edge": image_size},
                                crop_size={"height": image_size, "width": image_size})

    def config(tid, vocab):
        return LlavaConfig(
            text_config=dict(model_type="llama", **_text(vocab_size=vocab, head_dim=HEAD_DIM, bos_token_id=tid("<s>"),
                                                        eos_token_id=tid("</s>"), pad_token_id=tid("<pad>"))),
            vision_config=dict(model_type="clip_vision_model", hidden_size=V_HIDDEN, intermediate_size=V_FFN,
                               projection_dim=V_HIDDEN, num_hidden_layers=2, num_attention_heads=V_HEADS,
                               image_size=image_size, patch_size=patch, initializer_range=INIT_RANGE),
            image_token_index=tid("<image>"), image_seq_length=(image_size // patch) ** 2,
            vision_feature_select_strategy="default", vision_feature_layer=-2, tie_word_embeddings=False)

    return Spec(processor_class="LlavaProcessor", specials=specials, named=named, chat_template=LLAVA_TEMPLATE,
                image_processor=ip,
                processor_kwargs={"patch_size": patch, "vision_feature_select_strategy": "default",
                                  "image_token": "<image>", "num_additional_image_tokens": 1},
                make_config=config, end_of_turn="</s>", placeholder="<image>\n", generation_prompt="ASSISTANT:",
                feature_token="<image>", image_tokens=(image_size // patch) ** 2)


_BUILDERS: dict[str, Callable[[int], Spec]] = {
    "qwen2_vl": functools.partial(_qwen, version="2"),
    "qwen2_5_vl": functools.partial(_qwen, version="2.5"),
    "qwen3_vl": functools.partial(_qwen, version="3"),
    "smolvlm": functools.partial(_idefics_like, smolvlm=True),
    "idefics3": functools.partial(_idefics_like, smolvlm=False),
    "llava_onevision": _llava_onevision,
    "internvl": _internvl,
    "gemma3": _gemma3,
    "llava": _llava,
}
FAMILIES: tuple[str, ...] = tuple(_BUILDERS)


def family_spec(name: str, image_size: int = 64) -> Spec:
    if name not in _BUILDERS:
        raise ValueError(f"unknown family {name!r}; expected one of {', '.join(FAMILIES)}")
    return _BUILDERS[name](image_size)


# ------------------------------------------------------------------------------------------ writing

def build_family(name: str, out: Path, seed: int = 0, image_size: int = 64) -> Path:
    """Write a tiny random `name` checkpoint folder at `out` (created if needed) and return it."""
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    spec = family_spec(name, image_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _tokenizer(spec)
    tid = tokenizer.convert_tokens_to_ids
    config = spec.make_config(tid, _vocab_size(len(tokenizer)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config)
        if spec.post_init is not None:
            spec.post_init(model)
    model.generation_config = GenerationConfig(
        bos_token_id=config.get_text_config().bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tid(spec.end_of_turn)] + [tid(t) for t in spec.extra_eos])
    model.save_pretrained(out, safe_serialization=True)

    tokenizer.save_pretrained(out)
    spec.image_processor.save_pretrained(out)
    _set_json(out / "preprocessor_config.json", image_processor_type=_public_name(spec.image_processor))
    processor_config = {"processor_class": spec.processor_class, **spec.processor_kwargs}
    (out / "processor_config.json").write_text(json.dumps(processor_config, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").write_text(spec.chat_template)
    return out


def _public_name(image_processor) -> str:
    """The family's image processor name as a folder records it; AutoImageProcessor picks the backend
    (torchvision where it is installed, else the PIL class this module built)."""
    return type(image_processor).__name__.removesuffix("Pil")


def _set_json(path: Path, **items) -> None:
    data = json.loads(path.read_text())
    data.update(items)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":  # quick check: python -m tests.families [OUT]
    import sys
    import tempfile
    import time

    from transformers import AutoModelForImageTextToText

    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    for fam in FAMILIES:
        t = time.time()
        folder = build_family(fam, root / fam)
        m = AutoModelForImageTextToText.from_pretrained(folder)
        print(f"{fam:16s} {n_params(m):8d} params  {time.time() - t:5.2f}s  {folder}")
        assert n_params(m) < 1_000_000
