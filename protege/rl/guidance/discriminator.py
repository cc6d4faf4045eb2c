"""RIL's imitation reward as guidance for the question loop: each step the discriminator takes mu_d updates on
the step's student answers (label 1) against its teacher answers (label 0), then scores the group with one
forward; reward = w_sim * similarity(D) + w_answer * judge. With a fixed discriminator only the scoring runs."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from protege.data.rows import Row
from protege.eval.stats import auroc
from protege.models.processor import StudentProcessor
from protege.rewards.similarity import similarity_reward
from protege.rl.estimators.base import Returns
from protege.rl.guidance.base import Guidance, QuestionStep
from protege.runtime.distributed import rows_per_rank
from protege.runtime.micro import budget_tokens, rank_length_groups
from protege.runtime.placement import CPU, to_device, visiting
from protege.runtime.state import OptimizerState, Weights
from protege.runtime.updaters import even_forwards, make_updater


def _disc_batch(processor: StudentProcessor, rows: list[Row], texts: list[str], per_question: int,
                device: torch.device, tokens: int, agree: bool = False) -> list[tuple[list[int], dict]]:
    """The discriminator's inputs for every (question, answer), as micro-batches of at most `tokens` tokens of
    answers of like length, each cut to its own longest row, with the answers each holds (`agree`: as many on
    every rank, runtime.micro.rank_length_groups)."""
    qs = [r.question for r in rows for _ in range(per_question)]
    ims = [im for im in [r.image for r in rows] for _ in range(per_question)]  # each question decoded once
    whole = processor.encode_pairs(qs, ims, texts)  # right-padded: a row's length is its attended tokens
    out = []
    for group in rank_length_groups(whole["attention_mask"].sum(dim=1).tolist(), tokens, agree):
        group = sorted(group)
        part = to_device(processor.trimmed(whole if len(group) == len(texts) else
                                           processor.select_rows(whole, ims, group)), device)
        for key in ("mm_token_type_ids", "pixel_values", "image_grid_thw"):  # absent for text-only questions
            part.setdefault(key, None)
        out.append((group, part))
    return out


class DiscriminatorSimilarity(Guidance):
    """`disc` is the pretrained discriminator; under `rl.backend: deepspeed` its engine owns its placement and it
    stays on the device, else with `offload_idle` it visits the device only for its updates and scoring."""

    def __init__(self, disc: torch.nn.Module, cfg, processor: StudentProcessor, device: torch.device):
        self.disc, self.cfg, self.processor, self.device = disc, cfg, processor, device
        self.offload = cfg.offload_idle and cfg.backend == "torch"
        disc.to(CPU if self.offload else device)
        lr = cfg.lr if cfg.disc_lr is None else cfg.disc_lr
        self.updater = (make_updater(cfg.backend, disc, disc.trainable_parameters(), lr, cfg.zero_stage, device)
                        if cfg.discriminator == "updated" else None)
        self.host = self.updater if self.updater is not None else disc  # what moves when it visits
        self.parts = {"discriminator": Weights(self.host)}
        if self.updater is not None:  # absent when the discriminator is fixed
            self.parts["disc_optimizer"] = OptimizerState(self.updater)

    def shape(self, step: QuestionStep, returns: Returns) -> Returns:
        cfg, disc, G, B = self.cfg, self.disc, len(step.student_texts) // len(step.rows), len(step.rows)
        texts = [t for b in range(B) for t in step.student_texts[b * G:(b + 1) * G] + step.teacher_texts[b]]
        labels = torch.tensor(([1.0] * G + [0.0] * G) * B, device=self.device)
        with visiting(self.host, self.device, self.offload):
            parts = _disc_batch(self.processor, step.rows, texts, 2 * G, self.device,
                                budget_tokens(cfg.micro_batch_tokens, disc, self.device), even_forwards(self.updater))
            if self.updater is not None:
                # BCE's mean over the 2G * B answers of every rank, as micro-batch shares (rows_per_rank)
                denominator = rows_per_rank(len(texts))
                for _ in range(cfg.disc_updates):
                    for group, part in parts:
                        self.updater.backward(F.binary_cross_entropy_with_logits(disc(**part), labels[group],
                                                                                 reduction="sum") / denominator)
                    self.updater.step()
            with torch.no_grad():
                disc.eval()
                scores = torch.zeros(len(texts))  # [B * 2G] in answer order, on the CPU
                for group, part in parts:
                    scores[group] = torch.sigmoid(disc(**part)).float().cpu()
                disc.train()
        labels = labels.cpu()
        in_group = scores if cfg.teacher_in_group else scores.view(B, 2 * G)[:, :G].reshape(-1)
        sim = similarity_reward(in_group, cfg.similarity)  # [rows of the group]
        m = step.metrics
        m.update({"disc_accuracy": float(((scores >= 0.5).float() == labels).float().mean()),
                  "disc_score_student": float(scores[labels == 1].mean()),
                  "disc_score_teacher": float(scores[labels == 0].mean()),
                 # by rank: D may still order student above teacher answers when both crowd at 0.5, where
                 # the binary similarity's threshold reads nothing
                 "disc_auroc": auroc(scores.numpy(), labels.numpy())})
        m["similarity_reward_student"] = sim[~step.is_teacher].mean().item()
        if step.is_teacher.any():
            m["similarity_reward_teacher"] = sim[step.is_teacher].mean().item()
        return Returns.single_turn(cfg.w_sim * sim + cfg.w_answer * returns.episode, returns.group_size)
