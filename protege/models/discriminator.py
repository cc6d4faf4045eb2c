"""The discriminator: the student's backbone and initial weights + a d->1 head on the last token.

Output is the logit of "this answer came from the student" (student = 1, teacher = 0); sigmoid gives
D(q, o). It reads the last non-pad token's final hidden state, so left and right padding agree.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen2VLForConditionalGeneration, Qwen2VLModel

HEAD_FILE = "head.safetensors"


class Discriminator(nn.Module):
    def __init__(self, backbone: Qwen2VLModel):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.text_config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_student(cls, student_dir: str | Path) -> "Discriminator":
        # the student's own class loads with no unexpected keys; keep its backbone, drop the LM head
        student = Qwen2VLForConditionalGeneration.from_pretrained(str(student_dir), use_safetensors=True)
        return cls(student.model)

    def forward(self, input_ids, attention_mask, mm_token_type_ids, pixel_values, image_grid_thw, **_) -> torch.Tensor:
        """[N, T] inputs -> [N] logits."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, mm_token_type_ids=mm_token_type_ids,
                            pixel_values=pixel_values, image_grid_thw=image_grid_thw, use_cache=False)
        hidden = out.last_hidden_state  # [N, T, d]
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask * positions).argmax(dim=1)  # index of the last real token: [N]
        return self.head(hidden[torch.arange(hidden.shape[0]), last]).squeeze(-1)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.backbone.save_pretrained(str(path), safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(path / HEAD_FILE))
        (path / "discriminator.json").write_text(json.dumps({"head": "linear", "label": "student=1, teacher=0"}))

    @classmethod
    def load(cls, path: str | Path) -> "Discriminator":
        path = Path(path)
        if not (path / HEAD_FILE).exists():
            raise FileNotFoundError(f"{path}: no discriminator here ({HEAD_FILE} missing)")
        disc = cls(Qwen2VLModel.from_pretrained(str(path), use_safetensors=True))
        disc.head.load_state_dict(load_file(str(path / HEAD_FILE)))
        return disc
