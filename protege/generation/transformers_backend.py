"""Batched generation with transformers (KV cache, left padding)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from PIL import Image
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from protege.models.processor import StudentProcessor


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 16
    stop_at_code_block: bool = False  # tool use: end the turn once a fenced code block is closed

    def generate_kwargs(self) -> dict:
        kw = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample,
              "repetition_penalty": self.repetition_penalty}
        if self.do_sample:
            kw.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        return kw


@dataclass
class Completions:
    sequences: torch.Tensor          # [N, P + L] prompt + completion ids
    prompt_len: int                  # P: prompts are left-padded to one length
    completion_mask: torch.Tensor    # [N, L] 1 up to and including the first end-of-turn token
    texts: list[str] = field(default_factory=list)
    logprobs: torch.Tensor | None = None  # [N, L] the sampled tokens' log-probs, where a backend reports them
    # [N, L] False where the backend's log-prob was not finite (NaN, -inf): `logprobs` holds 0 there
    logprobs_finite: torch.Tensor | None = None


def completion_mask(completion: torch.Tensor, eos_id: int | list[int]) -> torch.Tensor:
    """[N, L] ids -> [N, L] mask that keeps tokens up to and including the first stop token (one id or a list)."""
    stops = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=completion.device)
    is_eos = torch.isin(completion, stops)
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos).long()


FENCE = "```"


def closes_code_block(text: str) -> bool:
    """True once `text` holds an opening and a closing code fence: the turn's tool call is complete."""
    return text.count(FENCE) >= 2


class CodeBlockStop(StoppingCriteria):
    """Stops each row of a batched generation once its completion closes a fenced code block (the row is
    then padded by transformers, so `sample` cuts the mask at the first pad)."""

    def __init__(self, tokenizer, prompt_len: int):
        self.tokenizer, self.prompt_len = tokenizer, prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_len:], skip_special_tokens=True)
        return torch.tensor([closes_code_block(t) for t in texts], device=input_ids.device)


@torch.no_grad()
def sample(model, processor: StudentProcessor, batch: dict[str, torch.Tensor], sampling: Sampling,
           num_return_sequences: int = 1, row_seeds: list[int] | None = None,
           images: list | None = None) -> Completions:
    """Generates for an encoded prompt batch; each prompt repeated `num_return_sequences` times in a row.
    `row_seeds` (one per prompt): each answer draws from its prompt's own stream (row_seeds.py), so it does not
    depend on the batch; without them, transformers' global generator draws for the batch. `images[i]` are
    prompt i's pictures, needed with `row_seeds` to repeat a prompt's vision inputs for its answers."""
    was_training = model.training
    model.eval()
    prompt_len = batch["input_ids"].shape[1]
    tok = processor.tokenizer
    extra = {}
    if sampling.stop_at_code_block:
        extra["stopping_criteria"] = StoppingCriteriaList([CodeBlockStop(tok, prompt_len)])
    pad = processor.pad_token_id
    inputs = {k: v for k, v in batch.items() if k != "answer_mask"}
    kwargs = sampling.generate_kwargs()
    if sampling.do_sample and row_seeds is not None:
        from protege.generation.row_seeds import RowSeededSampler

        if len(row_seeds) != batch["input_ids"].shape[0]:
            raise ValueError(f"{len(row_seeds)} row seeds for {batch['input_ids'].shape[0]} prompts")
        kwargs = {"max_new_tokens": sampling.max_new_tokens, "do_sample": False,
                  "repetition_penalty": sampling.repetition_penalty,
                  "logits_processor": LogitsProcessorList([RowSeededSampler(
                      row_seeds, num_return_sequences, sampling.temperature, sampling.top_k, sampling.top_p)])}
        if num_return_sequences > 1:  # greedy decoding takes one sequence per row: the rows are repeated here
            inputs = processor.repeat_rows(inputs, images or [None] * len(row_seeds), num_return_sequences)
            num_return_sequences = 1
    out = model.generate(**inputs, **kwargs, num_return_sequences=num_return_sequences,
                         pad_token_id=pad, eos_token_id=processor.stop_token_ids,
                         # an image placeholder in an answer would break re-scoring the sequence
                         suppress_tokens=processor.vision_token_ids, **extra)
    model.train(was_training)
    completion = out[:, prompt_len:]
    mask = completion_mask(completion, processor.stop_token_ids)
    if sampling.stop_at_code_block:  # a row stopped at its closed block is followed by padding only
        is_pad = (completion == pad).long()
        mask = mask * (is_pad.cumsum(dim=1) == 0).long()
    texts = tok.batch_decode(completion * mask + pad * (1 - mask), skip_special_tokens=True)
    return Completions(out, prompt_len, mask, [t.strip() for t in texts])


def complete(model, processor: StudentProcessor, batch: dict[str, torch.Tensor], images: list, sampling: Sampling,
             num_return_sequences: int = 1, questions: list[str] | None = None,
             row_seeds: list[int] | None = None) -> Completions:
    """`sample` with a transformers model, or with a generation engine standing in for it (e.g.
    vllm_backend.VLLMGenerator), which also needs each prompt's images as pictures and its `questions` (the batch
    was encoded from `processor.encode_prompts(questions, images)`): the engine runs the model's own image
    processor and placeholder expansion on the unexpanded prompt. Every caller that may be handed either goes
    through here. `row_seeds`: one per prompt, see `sample` (an engine seeds each prompt's request with it)."""
    if isinstance(model, torch.nn.Module):
        return sample(model, processor, batch, sampling, num_return_sequences, row_seeds, images)
    seeds = {} if row_seeds is None else {"row_seeds": row_seeds}
    if questions is None:  # an engine that needs unexpanded prompts refuses images without them
        return model.sample(processor, batch, images, sampling, num_return_sequences, **seeds)
    return model.sample(processor, batch, images, sampling, num_return_sequences,
                        prompt_ids=processor.engine_prompt_ids(questions, images), **seeds)


def generate_answers(model, processor: StudentProcessor, questions: list[str], images: list[Image.Image] | None,
                     sampling: Sampling, batch_size: int, num_return_sequences: int = 1,
                     progress=None, image_batches: Iterator[list] | None = None) -> tuple[list[str], list[int], float]:
    """Answers for many prompts in batches: (texts, completion token counts, seconds). `model` may also be a
    generation engine (see `complete`). `image_batches`, in place of `images`: each batch's images in order
    (protege.data.loader.image_batches), so a table's images are decoded batch by batch."""
    if image_batches is None:
        image_batches = (images[i:i + batch_size] for i in range(0, len(questions), batch_size))
    texts, tokens, t0 = [], [], time.perf_counter()
    for i in range(0, len(questions), batch_size):
        pictures = next(image_batches)
        batch = processor.encode_prompts(questions[i:i + batch_size], pictures)
        if isinstance(model, torch.nn.Module):  # e.g. RL on CUDA; an engine takes its prompts on the CPU
            batch = {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        c = complete(model, processor, batch, pictures, sampling, num_return_sequences,
                     questions=questions[i:i + batch_size])
        texts += c.texts
        tokens += c.completion_mask.sum(dim=1).tolist()
        if progress:
            progress(min(i + batch_size, len(questions)), len(questions))
    return texts, tokens, time.perf_counter() - t0
