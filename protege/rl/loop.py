"""The RL loop for `dr_grpo` and `grpo`: sample a group per question, judge, advantage, one update.

Read top to bottom: this is the whole algorithm. The math lives in advantages.py and losses.py.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from protege.config import RLConfig
from protege.data.rows import Row
from protege.generation.transformers_backend import Sampling, sample
from protege.models.processor import StudentProcessor
from protege.models.student import save_student
from protege.rewards.judge import rule_judge
from protege.rl.advantages import group_advantages
from protege.rl.logprobs import completion_logprobs, repeat_vision
from protege.rl.losses import policy_loss
from protege.rl.trainable import select_trainable


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return out_dir / f"step-{step:05d}"


def run_rl(policy, ref, processor: StudentProcessor, rows: list[Row], cfg: RLConfig, out_dir: Path, seed: int,
           on_log: Callable[[int, dict], None] | None = None) -> list[Path]:
    """Trains `policy` in place; `ref` is the frozen SFT model. Returns the checkpoint folders written."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    params = select_trainable(policy, cfg.trainable)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)  # constant LR, as in RIL
    ref.eval().requires_grad_(False)
    sampling = Sampling(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                        repetition_penalty=cfg.repetition_penalty, max_new_tokens=cfg.max_new_tokens)
    tok = processor.tokenizer
    G = cfg.group_size
    order: list[int] = []
    saved = []
    for step in range(1, cfg.steps + 1):
        t0 = time.perf_counter()
        # 1. questions for this step (epoch-wise shuffle of the curated pool)
        if len(order) < cfg.questions_per_step:
            fresh = list(range(len(rows)))
            rng.shuffle(fresh)
            order += fresh
        idx, order = order[:cfg.questions_per_step], order[cfg.questions_per_step:]
        batch_rows = [rows[i] for i in idx]
        prompts = processor.encode_prompts([r.question for r in batch_rows], [r.image for r in batch_rows])

        # 2. G samples per question from pi_old (= the current policy)
        c = sample(policy, processor, prompts, sampling, num_return_sequences=G)

        # 3. rewards from the rule-based judge, group-relative advantages
        rewards = torch.tensor([rule_judge(r.answer, c.texts[i * G + g], r.candidates)
                                for i, r in enumerate(batch_rows) for g in range(G)]).view(-1, G)  # [B, G]
        adv = group_advantages(rewards, scale_by_std=cfg.algorithm == "grpo").flatten()  # [B*G]

        # 4. one policy update (mu = 1): pi_old equals pi_theta before this step, so its log-probs are
        #    the detached current ones and the ratio starts at exactly 1
        vision = repeat_vision(prompts, G)
        with torch.no_grad():
            logp_ref = completion_logprobs(ref, c, vision, processor.image_token_id, tok.pad_token_id)
        logp, entropy = completion_logprobs(policy, c, vision, processor.image_token_id, tok.pad_token_id,
                                            with_entropy=True)
        mask = c.completion_mask.float()
        loss, stats = policy_loss(logp, logp.detach(), logp_ref, adv, mask, clip_eps=cfg.clip_eps,
                                  kl_beta=cfg.kl_beta, aggregation=cfg.algorithm, max_len=cfg.max_new_tokens)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"RL loss is {loss.item()} at step {step}; last good checkpoint: "
                                     f"{saved[-1] if saved else 'none (SFT model)'}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

        if step % cfg.save_every == 0 or step == cfg.steps:
            saved.append(checkpoint_dir(out_dir, step))
            save_student(policy, processor, saved[-1])
        if on_log:
            seconds = time.perf_counter() - t0
            n_tok = float(mask.sum())
            on_log(step, {"reward": rewards.mean().item(), "loss": loss.item(), "kl": stats["kl"].item(),
                          "clip_fraction": stats["clip_fraction"].item(),
                          "entropy": float((entropy.detach() * mask).sum() / max(n_tok, 1.0)),
                          "response_length": n_tok / mask.shape[0], "advantage_std": adv.std().item(),
                          "samples_per_s": mask.shape[0] / seconds, "tokens_per_s": n_tok / seconds})
    return saved
