"""Answers benchmark items with a student checkpoint: batched, greedy by default, tokens and latency
recorded per answer."""
from __future__ import annotations

import io
import time

from PIL import Image

from protege.bench.items import BenchItem
from protege.bench.prompts import build_prompt
from protege.data.rows import stand_ins
from protege.eval.score import Prediction
from protege.generation.transformers_backend import Sampling, complete


def decode_images(item: BenchItem) -> list[Image.Image]:
    out = []
    for png in item.images:
        with Image.open(io.BytesIO(png)) as im:
            out.append(im.convert("RGB"))
    return out


def prompt_extent(processor, items: list[BenchItem], questions: list[str], images: list,
                  batch_size: int = 32) -> tuple[int, int]:
    """(the longest prompt in tokens, image tokens included; the most images one prompt holds) over benchmark
    items and question rows (`questions[i]` with `images[i]`: one image, a list, None, or a Row's `source`):
    what a generation engine's context must hold. A row's images are measured as blank images of their sizes
    (read from the files' headers): the tokens an image takes depend on its size alone."""
    prompts = [build_prompt(it) for it in items] + list(questions)
    longest = most = 0
    for start in range(0, len(prompts), batch_size):
        chunk = range(start, min(start + batch_size, len(prompts)))
        pics = [decode_images(items[i]) if i < len(items) else stand_ins(images[i - len(items)]) for i in chunk]
        per_prompt = processor.image_lists(pics)
        batch = processor.encode_prompts([prompts[i] for i in chunk], per_prompt)
        longest = max(longest, int(batch["attention_mask"].sum(dim=1).max()))
        most = max(most, max(len(p) for p in per_prompt))
    return longest, most


def generate_predictions(model, processor, items: list[BenchItem], batch_size: int, max_new_tokens: int,
                         sampling: Sampling | None = None, progress=None) -> list[Prediction]:
    """One Prediction per item, in item order. `latency_s` is the wall time of the batch the answer came
    from (what a caller waits for it); `tokens` counts its completion tokens up to end-of-turn."""
    sampling = sampling or Sampling(do_sample=False, max_new_tokens=max_new_tokens)
    prompts = [build_prompt(it) for it in items]
    # similar lengths share a batch, so little of each batch is padding; answers go back in item order
    order = sorted(range(len(items)), key=lambda i: (len(items[i].images), len(prompts[i])))
    by_item: dict[int, Prediction] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        t0 = time.perf_counter()
        images = [decode_images(items[i]) for i in chunk]
        batch = processor.encode_prompts([prompts[i] for i in chunk], images)
        c = complete(model, processor, batch, images, sampling,  # `model` may be a vLLM engine
                     questions=[prompts[i] for i in chunk])
        seconds = time.perf_counter() - t0
        for i, text, n in zip(chunk, c.texts, c.completion_mask.sum(dim=1).tolist()):
            by_item[i] = Prediction(items[i].index, text, int(n), seconds)
        if progress:
            progress(len(by_item), len(items))
    return [by_item[i] for i in range(len(items))]
