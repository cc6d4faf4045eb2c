"""Tool turns end at a closed code block: the stopping rule and the per-row mask after a stop."""
import torch

from protege.generation.transformers_backend import CodeBlockStop, closes_code_block


def test_closes_code_block_needs_an_opening_and_a_closing_fence():
    assert not closes_code_block("I will compute it.")
    assert not closes_code_block("Compute:\n```python\nprint(47 * 38)")
    assert not closes_code_block("```python\nprint(1)\n``")   # two backticks are not a fence
    assert closes_code_block("Compute:\n```python\nprint(47 * 38)\n```")
    assert closes_code_block("```\nprint(2)\n```\nand more")  # no language tag


def test_stop_is_per_row_and_ignores_the_prompt(tiny_processor):
    tok = tiny_processor.tokenizer
    prompt = tok("```python\n```", add_special_tokens=False)["input_ids"]  # fences in the prompt do not count
    rows = ["x = 1\n```python\nprint(3)\n```", "```python\nprint(3)\n"]
    ids = [prompt + tok(r, add_special_tokens=False)["input_ids"] for r in rows]
    width = max(len(i) for i in ids)
    batch = torch.tensor([i + [tok.pad_token_id] * (width - len(i)) for i in ids])
    stop = CodeBlockStop(tok, prompt_len=len(prompt))
    assert stop(batch, None).tolist() == [True, False]
