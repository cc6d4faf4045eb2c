"""The student: any image-text-to-text model loaded from a Hugging Face folder, or the embedded world's
tiny Qwen2-VL built from params (then saved as such a folder and loaded like any other)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

from protege import provenance
from protege.config import ModelConfig
from protege.models.hf_folder import check_folder
from protege.models.head_input import contiguous_head_input
from protege.models.processor import StudentProcessor
from protege.models.tokenizer import EOS, IMAGE_PAD, PAD, VIDEO_PAD, VISION_END, VISION_START


def tiny_config(cfg: ModelConfig, processor: StudentProcessor) -> Qwen2VLConfig:
    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in (PAD, EOS, IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)}
    head_dim = cfg.hidden_size // cfg.num_heads
    half = head_dim // 2  # mrope_section must sum to head_dim / 2 (temporal, height, width)
    t = half // 4
    h = (half - t) // 2
    mrope = [t, h, half - t - h]
    text = dict(vocab_size=len(tok), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=1024,
                initializer_range=cfg.initializer_range,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
                bos_token_id=None, eos_token_id=ids[EOS], pad_token_id=ids[PAD])
    vision = dict(depth=cfg.vision_depth, embed_dim=cfg.vision_embed_dim, hidden_size=cfg.hidden_size,
                  num_heads=cfg.vision_heads, patch_size=cfg.patch_size, spatial_merge_size=cfg.merge_size,
                  temporal_patch_size=2, initializer_range=cfg.initializer_range, mlp_ratio=4)
    return Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids[IMAGE_PAD],
                         video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
                         vision_end_token_id=ids[VISION_END], tie_word_embeddings=False)


def build_student(cfg: ModelConfig, processor: StudentProcessor, seed: int) -> Qwen2VLForConditionalGeneration:
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(tiny_config(cfg, processor))
    tok = processor.tokenizer
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None)
    return contiguous_head_input(model)


def save_student(model, processor: StudentProcessor, path: str | Path) -> None:
    """A checkpoint folder: weights (a LoRA model's merged full weights, plus its adapter under adapter/), the
    processor's files and, inside a stage, protege.json (protege.provenance)."""
    from protege.models.lora import is_lora, save_lora_checkpoint

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if is_lora(model):
        save_lora_checkpoint(model, path)
    else:
        model.save_pretrained(str(path), safe_serialization=True)
    processor.save_pretrained(path)
    provenance.write(path)  # what made it, when a stage is running


def placement(device: torch.device | None) -> dict:
    """from_pretrained's arguments that read the weights straight onto a GPU, tensor by tensor from the
    safetensors files, instead of building the whole model in host memory first (at 7B, ~15 GB per rank)."""
    if device is None or device.type != "cuda":
        return {}
    return {"device_map": {"": str(device)}}


def load_student(path: str | Path, dtype=torch.float32, trust_remote_code: bool = False,
                 device: torch.device | None = None):
    """(model, processor) of a checkpoint folder, through AutoModelForImageTextToText and the folder's own
    processor, its weights read onto `device` (a GPU: directly, `placement`); the folder is checked first
    (CheckpointError names what is missing)."""
    from transformers import AutoModelForImageTextToText

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: no student checkpoint here (config.json missing); "
                                "run the stage that writes it first")
    check_folder(path, trust_remote_code)
    model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype, use_safetensors=True,
                                                        trust_remote_code=trust_remote_code, **placement(device))
    return contiguous_head_input(model), StudentProcessor.from_pretrained(path, trust_remote_code)
