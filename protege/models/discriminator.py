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

from protege import provenance
from protege.models.hf_folder import copy_processor_files
from protege.models.precision import DTYPES, float32_compute, with_precision
from protege.models.recompute import recomputes

HEAD_FILE = "head.safetensors"


def base_model(model: nn.Module) -> nn.Module:
    """An image-text-to-text model's base model (the module its LM head sits on)."""
    return getattr(model, getattr(model, "base_model_prefix", "model"))


class Discriminator(nn.Module):
    # the head stays fp32 on a bf16 backbone (precision.with_precision) and computes in fp32: its d products
    # summed into the one logit that the loss and the similarity reward read are not rounded to bf16
    keep_in_float32 = ("head",)

    def __init__(self, backbone: nn.Module, source: str | Path | None = None):
        super().__init__()
        self.backbone = backbone
        self.source = Path(source) if source is not None else None  # the folder its processor files come from
        self.head = nn.Linear(backbone.config.get_text_config().hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_student(cls, student_dir: str | Path, trust_remote_code: bool = False,
                     dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> "Discriminator":
        # the student's own class loads with no unexpected keys; keep its base model, drop the LM head
        from transformers import AutoModelForImageTextToText

        from protege.models.student import placement

        student = AutoModelForImageTextToText.from_pretrained(str(student_dir), use_safetensors=True, dtype=dtype,
                                                              trust_remote_code=trust_remote_code,
                                                              **placement(device))
        return cls(base_model(student), student_dir)

    def add_lora(self, rank: int, alpha: float, dropout: float, target_modules) -> "Discriminator":
        """Fresh adapters on the backbone (peft); the adapters and the head are what trains."""
        from protege.models.lora import add_lora

        self.backbone = add_lora(self.backbone, rank, alpha, dropout, target_modules)
        self.head.requires_grad_(True)
        return self

    @property
    def config(self):
        """The backbone's config: what its memory plan and micro-batch budget are read from."""
        return self.backbone.config

    def enable_recompute(self) -> "Discriminator":
        """Activation checkpointing on the backbone (`model.gradient_checkpointing`): each layer keeps its input
        only and recomputes the rest in the backward pass, as the policy does."""
        self.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return self

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether the backbone recomputes (the micro-batch budget reads it, runtime.micro.budget_tokens)."""
        return recomputes(self.backbone)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, input_ids, attention_mask, answer_mask=None, **inputs) -> torch.Tensor:
        """[N, T] inputs (+ the family's vision inputs) -> [N] logits."""
        inputs = {k: v for k, v in inputs.items() if v is not None}
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs)
        hidden = out.last_hidden_state  # [N, T, d]
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        last = (attention_mask * positions).argmax(dim=1)  # index of the last real token: [N]
        last_hidden = hidden[torch.arange(hidden.shape[0]), last]
        with float32_compute(last_hidden):  # the head's own dtype (fp32), not the backbone's bf16 autocast
            return self.head(last_hidden.to(self.head.weight.dtype)).squeeze(-1)

    def save(self, path: str | Path) -> None:
        """A LoRA backbone is saved merged (W + scale * B A): the folder loads with AutoModel either way."""
        from protege.models.lora import is_lora, merged_state_dict

        path = Path(path)
        if is_lora(self.backbone):
            self.backbone.get_base_model().save_pretrained(str(path), state_dict=merged_state_dict(self.backbone),
                                                           safe_serialization=True)
        else:
            self.backbone.save_pretrained(str(path), safe_serialization=True)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, str(path / HEAD_FILE))
        (path / "discriminator.json").write_text(json.dumps({"head": "linear", "label": "student=1, teacher=0"}))
        if self.source is not None:
            copy_processor_files(self.source, path)
        provenance.write(path)

    @classmethod
    def load(cls, path: str | Path, trust_remote_code: bool = False,
             dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> "Discriminator":
        from transformers import AutoModel

        from protege.models.student import placement

        path = Path(path)
        if not (path / HEAD_FILE).exists():
            raise FileNotFoundError(f"{path}: no discriminator here ({HEAD_FILE} missing)")
        disc = cls(AutoModel.from_pretrained(str(path), use_safetensors=True, dtype=dtype,
                                             trust_remote_code=trust_remote_code, **placement(device)), path)
        disc.head.load_state_dict(load_file(str(path / HEAD_FILE)))  # fp32, whatever dtype it was saved in
        return disc


def load_discriminator(path: str | Path, *, from_student: bool = False, trust_remote_code: bool = False,
                       dtype: str = "float32", lora=None, recompute: bool = False,
                       device: torch.device | None = None) -> Discriminator:
    """The discriminator saved at `path` (or a fresh one on the student checkpoint at `path`) in `dtype`
    (`model.dtype`: bf16 backbone and autocast forwards; the head stays float32), with fresh adapters on its
    backbone when `lora` (`model.lora` settings) is given, recomputing activations in the backward pass when
    `recompute` (`model.gradient_checkpointing`), its weights read onto `device` (a GPU: directly)."""
    make = Discriminator.from_student if from_student else Discriminator.load
    disc = with_precision(make(path, trust_remote_code, dtype=DTYPES[dtype], device=device), dtype)
    if recompute:  # before the adapters: peft's wrapper passes the call on, and the base model's layers recompute
        disc.enable_recompute()
    if lora is not None:
        disc.add_lora(lora.rank, lora.alpha, lora.dropout, lora.target_modules)
    return disc
