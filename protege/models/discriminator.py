"""The discriminator: the student's backbone and initial weights + a d->1 head on the last token.

Output is the logit of "this answer came from the student" (student = 1, teacher = 0); sigmoid gives
D(q, o). The backbone is the student family's base model (the image-text-to-text model without its LM
head: Qwen2VLModel, LlavaOnevisionModel, Gemma3Model, ...). It reads the last non-pad token's final
hidden state, so left and right padding agree. Saved as a folder: the base model (loadable with
AutoModel), the head, and the processor's files.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from protege.models.hf_folder import copy_processor_files

HEAD_FILE = "head.safetensors"


def base_model(model: nn.Module) -> nn.Module:
    """An image-text-to-text model's base model (the module its LM head sits on)."""
    return getattr(model, getattr(model, "base_model_prefix", "model"))


class Discriminator(nn.Module):
    def __init__(self, backbone: nn.Module, source: str | Path | None = None):
        super().__init__()
        self.backbone = backbone
        self.source = Path(source) if source is not None else None  # the folder its processor files come from
        self.head = nn.Linear(backbone.config.get_text_config().hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_student(cls, student_dir: str | Path, trust_remote_code: bool = False) -> "Discriminator":
        # the student's own class loads with no unexpected keys; keep its base model, drop the LM head
        from transformers import AutoModelForImageTextToText

        student = AutoModelForImageTextToText.from_pretrained(str(student_dir), use_safetensors=True,
                                                              trust_remote_code=trust_remote_code)
        return cls(base_model(student), student_dir)

    def forward(self, input_ids, attention_mask, answer_mask=None, **inputs) -> torch.Tensor:
        """[N, T] inputs (+ the family's vision inputs) -> [N] logits."""
        inputs = {k: v for k, v in inputs.items() if v is not None}
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs)
        hidden = out.last_hidden_state  # [N, T, d]
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask * positions).argmax(dim=1)  # index of the last real token: [N]
        return self.head(hidden[torch.arange(hidden.shape[0]), last].to(self.head.weight.dtype)).squeeze(-1)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        self.backbone.save_pretrained(str(path), safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(path / HEAD_FILE))
        (path / "discriminator.json").write_text(json.dumps({"head": "linear", "label": "student=1, teacher=0"}))
        if self.source is not None:
            copy_processor_files(self.source, path)

    @classmethod
    def load(cls, path: str | Path, trust_remote_code: bool = False) -> "Discriminator":
        from transformers import AutoModel

        path = Path(path)
        if not (path / HEAD_FILE).exists():
            raise FileNotFoundError(f"{path}: no discriminator here ({HEAD_FILE} missing)")
        disc = cls(AutoModel.from_pretrained(str(path), use_safetensors=True, trust_remote_code=trust_remote_code),
                   path)
        disc.head.load_state_dict(load_file(str(path / HEAD_FILE)))
        return disc
