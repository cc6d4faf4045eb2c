"""Turns (image, question[, answer]) into model inputs for a Qwen2-VL-family student.

transformers' Qwen2VLProcessor wants a video processor (torchvision); this one needs only the PIL image
processor and the tokenizer, and is what every stage uses for prompts, training batches and generation.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from protege.models.tokenizer import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START


@dataclass
class StudentProcessor:
    tokenizer: PreTrainedTokenizerBase
    image_processor: Qwen2VLImageProcessorPil

    @classmethod
    def create(cls, tokenizer: PreTrainedTokenizerBase, image_size: int, patch_size: int,
               merge_size: int) -> "StudentProcessor":
        pixels = image_size * image_size  # min = max: every image yields the same number of tokens
        ip = Qwen2VLImageProcessorPil(patch_size=patch_size, merge_size=merge_size, temporal_patch_size=2,
                                      min_pixels=pixels, max_pixels=pixels)
        return cls(tokenizer, ip)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "StudentProcessor":
        return cls(AutoTokenizer.from_pretrained(str(path)), Qwen2VLImageProcessorPil.from_pretrained(str(path)))

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(str(path))
        self.image_processor.save_pretrained(str(path))

    @property
    def image_token_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    @property
    def vision_token_ids(self) -> list[int]:
        """Tokens that only the processor may place (never generated)."""
        return [self.tokenizer.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)]

    def prompt(self, question: str, with_image: bool = True) -> str:
        content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": question}]
        return self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                  add_generation_prompt=True)

    def _images(self, images: list[Image.Image]) -> dict[str, torch.Tensor]:
        out = self.image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    def _expand(self, text: str, grid_thw: torch.Tensor) -> str:
        n = int(grid_thw.prod()) // (self.image_processor.merge_size ** 2)
        return text.replace(IMAGE_PAD, IMAGE_PAD * n, 1)

    def encode_prompts(self, questions: list[str], images: list[Image.Image]) -> dict[str, torch.Tensor]:
        """Left-padded prompts for generation."""
        vis = self._images(images)
        texts = [self._expand(self.prompt(q), g) for q, g in zip(questions, vis["image_grid_thw"])]
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", padding_side="left",
                             add_special_tokens=False)
        return self._finish(enc, vis)

    def encode_pairs(self, questions: list[str], images: list[Image.Image], answers: list[str],
                     padding_side: str = "right") -> dict[str, torch.Tensor]:
        """Prompt + answer + end-of-turn, with `answer_mask` marking the answer tokens (loss targets)."""
        vis = self._images(images)
        eos = self.tokenizer.eos_token
        ids, masks = [], []
        for q, a, g in zip(questions, answers, vis["image_grid_thw"]):
            p = self.tokenizer(self._expand(self.prompt(q), g), add_special_tokens=False)["input_ids"]
            full = self.tokenizer(self._expand(self.prompt(q), g) + a + eos, add_special_tokens=False)["input_ids"]
            if full[: len(p)] != p:
                raise ValueError(f"tokenizer does not keep the prompt a prefix of prompt+answer for {q!r}")
            ids.append(full)
            masks.append([0] * len(p) + [1] * (len(full) - len(p)))
        width = max(map(len, ids))
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        attn = torch.zeros((len(ids), width), dtype=torch.long)
        answer_mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, (row, m) in enumerate(zip(ids, masks)):
            sl = slice(0, len(row)) if padding_side == "right" else slice(width - len(row), width)
            input_ids[i, sl] = torch.tensor(row)
            attn[i, sl] = 1
            answer_mask[i, sl] = torch.tensor(m)
        enc = {"input_ids": input_ids, "attention_mask": attn}
        out = self._finish(enc, vis)
        out["answer_mask"] = answer_mask
        return out

    def _finish(self, enc, vis) -> dict[str, torch.Tensor]:
        input_ids = enc["input_ids"]
        # transformers 5 requires mm_token_type_ids whenever image_grid_thw is passed
        return {"input_ids": input_ids, "attention_mask": enc["attention_mask"],
                "mm_token_type_ids": (input_ids == self.image_token_id).long(), **vis}

    def token_length(self, question: str, answer: str, image: Image.Image) -> int:
        """Tokens the model sees for prompt + answer, image tokens included."""
        vis = self._images([image])
        text = self._expand(self.prompt(question), vis["image_grid_thw"][0]) + answer + self.tokenizer.eos_token
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
