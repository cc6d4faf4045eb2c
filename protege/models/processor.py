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

    def prompt(self, question: str, n_images: int = 1) -> str:
        content = [{"type": "image"}] * n_images + [{"type": "text", "text": question}]
        return self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                  add_generation_prompt=True)

    def _images(self, per_prompt: list[list[Image.Image]]) -> dict[str, torch.Tensor]:
        flat = [im for ims in per_prompt for im in ims]
        if not flat:  # text-only batch: the model runs as a plain language model
            return {}
        # the same image object repeated (a question with several answers to score) is processed once
        first: dict[int, int] = {}  # id(image) -> its position among the unique images
        unique: list[Image.Image] = []
        for im in flat:
            if id(im) not in first:
                first[id(im)] = len(unique)
                unique.append(im)
        out = self.image_processor(images=[im.convert("RGB") for im in unique], return_tensors="pt")
        grids = out["image_grid_thw"]
        if len(unique) == len(flat):
            return {"pixel_values": out["pixel_values"], "image_grid_thw": grids}
        patches = out["pixel_values"].split(grids.prod(dim=1).tolist())
        order = [first[id(im)] for im in flat]
        return {"pixel_values": torch.cat([patches[j] for j in order]), "image_grid_thw": grids[order]}

    def _expanded_prompts(self, questions: list[str], per_prompt: list[list[Image.Image]],
                          vis: dict[str, torch.Tensor]) -> list[str]:
        """Chat prompts with each image placeholder repeated once per merged patch of its image."""
        grids = iter(vis.get("image_grid_thw", []))
        merge = self.image_processor.merge_size ** 2
        texts = []
        for q, ims in zip(questions, per_prompt):
            text = self.prompt(q, len(ims))
            head, parts = "", text.split(IMAGE_PAD)
            for part in parts[:-1]:  # one placeholder per image, in order
                head += part + IMAGE_PAD * (int(next(grids).prod()) // merge)
            texts.append(head + parts[-1])
        return texts

    @staticmethod
    def _as_lists(images: list) -> list[list[Image.Image]]:
        """Each prompt's images: a single image, a list of images, or None / [] for none."""
        return [[] if im is None else list(im) if isinstance(im, (list, tuple)) else [im] for im in images]

    def encode_prompts(self, questions: list[str], images: list) -> dict[str, torch.Tensor]:
        """Left-padded prompts for generation; `images[i]` is one image, a list of images, or None."""
        per_prompt = self._as_lists(images)
        vis = self._images(per_prompt)
        texts = self._expanded_prompts(questions, per_prompt, vis)
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", padding_side="left",
                             add_special_tokens=False)
        return self._finish(enc, vis)

    def encode_pairs(self, questions: list[str], images: list, answers: list[str],
                     padding_side: str = "right") -> dict[str, torch.Tensor]:
        """Prompt + answer + end-of-turn, with `answer_mask` marking the answer tokens (loss targets)."""
        per_prompt = self._as_lists(images)
        vis = self._images(per_prompt)
        eos = self.tokenizer.eos_token
        ids, masks = [], []
        for prompt, a in zip(self._expanded_prompts(questions, per_prompt, vis), answers):
            p = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            full = self.tokenizer(prompt + a + eos, add_special_tokens=False)["input_ids"]
            if full[: len(p)] != p:
                raise ValueError(f"tokenizer does not keep the prompt a prefix of prompt+answer for {prompt!r}")
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
        out = {"input_ids": input_ids, "attention_mask": enc["attention_mask"]}
        if vis:  # transformers 5 requires mm_token_type_ids whenever image_grid_thw is passed
            out.update(mm_token_type_ids=(input_ids == self.image_token_id).long(), **vis)
        return out

    def token_length(self, question: str, answer: str, image) -> int:
        """Tokens the model sees for prompt + answer, image tokens included."""
        per_prompt = self._as_lists([image])
        text = self._expanded_prompts([question], per_prompt, self._images(per_prompt))[0]
        return len(self.tokenizer(text + answer + self.tokenizer.eos_token, add_special_tokens=False)["input_ids"])
