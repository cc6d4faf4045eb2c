"""ZeRO-3 with LoRA adapters is named as the wrong stage, with the reason and the setting to change."""
import copy

from protege.models.lora import add_lora
from protege.runtime.updaters import zero3_lora_warning


def test_zero3_with_adapters_is_warned_and_zero2_or_full_weights_are_not(tiny_student):
    adapted = add_lora(copy.deepcopy(tiny_student), rank=2, alpha=4, dropout=0.0, target_modules="auto")
    said = zero3_lora_warning(adapted, 3, "rl.backend")
    assert said is not None and said.startswith("rl.zero_stage is 3 with LoRA adapters")
    assert "gathers" in said and "Set rl.zero_stage: 2" in said
    assert zero3_lora_warning(adapted, 2, "rl.backend") is None
    assert zero3_lora_warning(tiny_student, 3, "sft.backend") is None  # full weights train: ZeRO-3 is their choice
