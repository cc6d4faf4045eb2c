"""generate's prefill hands the LM head a strided view; the head must see a contiguous input (a strided one makes
torch's CPU matmul copy the head's weight once per row)."""
import random

import torch

from protege.config import ModelConfig
from protege.models.head_input import contiguous_head_input
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.world.questions import make_item


def _student():
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(20)]
    processor = StudentProcessor.create(train_tokenizer([i.question for i in items] + [i.answer for i in items], 300),
                                        64, 8, 2)
    return build_student(ModelConfig(), processor, seed=0), processor


def _head_inputs(model, prompt_len: int = 5) -> list[bool]:
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda m, a: seen.append(a[0].is_contiguous()))
    ids = torch.randint(5, 50, (3, prompt_len))
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    return seen


def test_the_prefill_view_reaches_the_head_contiguous():
    model, _ = _student()
    seen = _head_inputs(model)
    assert seen and all(seen)


def test_without_the_hook_the_prefill_view_is_strided_and_the_hook_is_added_once():
    model, _ = _student()
    head = model.get_output_embeddings()
    head._forward_pre_hooks.clear()
    assert _head_inputs(model)[0] is False  # what the hook is for: transformers slices the last position
    contiguous_head_input(model)
    contiguous_head_input(model)
    assert len(head._forward_pre_hooks) == 2  # the test's recorder and ours, once
