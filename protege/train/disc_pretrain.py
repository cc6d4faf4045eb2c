"""Discriminator pretraining: BCE with student answers -> 1 and answers of any teacher -> 0."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image

from protege.config import DiscPretrainConfig
from protege.models.discriminator import Discriminator
from protege.models.processor import StudentProcessor


@dataclass
class Example:
    question_id: str
    question: str
    image: Image.Image
    answer: str
    label: float  # 1 = student, 0 = teacher


def auroc(scores: list[float], labels: list[float]) -> float:
    """Probability that a random positive outscores a random negative (ties count half)."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _batch(processor: StudentProcessor, examples: list[Example]) -> dict[str, torch.Tensor]:
    return processor.encode_pairs([e.question for e in examples], [e.image for e in examples],
                                  [e.answer for e in examples])


@torch.no_grad()
def evaluate(disc: Discriminator, processor: StudentProcessor, examples: list[Example], batch_size: int) -> dict:
    disc.eval()
    scores = []
    for i in range(0, len(examples), batch_size):
        scores += torch.sigmoid(disc(**_batch(processor, examples[i:i + batch_size]))).tolist()
    disc.train()
    labels = [e.label for e in examples]
    acc = sum((s >= 0.5) == (y == 1) for s, y in zip(scores, labels)) / max(1, len(labels))
    return {"accuracy": acc, "auroc": auroc(scores, labels)}


def split_by_question(examples: list[Example], holdout_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Held-out questions never appear in training, so accuracy measures generalisation."""
    ids = sorted({e.question_id for e in examples})
    random.Random(seed).shuffle(ids)
    held = set(ids[: max(1, int(len(ids) * holdout_fraction))])
    return [e for e in examples if e.question_id not in held], [e for e in examples if e.question_id in held]


def pretrain_discriminator(disc: Discriminator, processor: StudentProcessor, examples: list[Example],
                           cfg: DiscPretrainConfig, seed: int,
                           on_log: Callable[[int, dict], None] | None = None) -> dict:
    train, held = split_by_question(examples, cfg.holdout_fraction, seed)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(disc.parameters(), lr=cfg.lr)
    disc.train()
    log_every = max(1, cfg.steps // 10)
    for step in range(1, cfg.steps + 1):
        batch_ex = rng.sample(train, min(cfg.batch_size, len(train)))
        logits = disc(**_batch(processor, batch_ex))
        target = torch.tensor([e.label for e in batch_ex])
        loss = F.binary_cross_entropy_with_logits(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if on_log and (step % log_every == 0 or step == cfg.steps):
            acc = ((logits.detach() >= 0) == (target == 1)).float().mean().item()
            on_log(step, {"loss": loss.item(), "train_batch_accuracy": acc})
    metrics = evaluate(disc, processor, held, cfg.batch_size)
    return {"heldout_accuracy": metrics["accuracy"], "heldout_auroc": metrics["auroc"],
            "train_examples": len(train), "heldout_examples": len(held)}
