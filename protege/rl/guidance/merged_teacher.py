"""GTR-Turbo's merged teacher as guidance: the running merge of the policy's checkpoints (merged_teacher.py)
either costs each episode its clamped KL to the teacher on the reward (`kl`), or writes thoughts for
observations of this step that the policy learns by cross-entropy (`sft`). Either way the updated weights join
the merge after every step, and the last teacher is saved beside the checkpoints."""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from protege.generation.transformers_backend import Sampling, complete
from protege.models.processor import StudentProcessor
from protege.models.student import save_student
from protege.rl.episodes import Episode, pack, prompt_batch
from protege.rl.trajectory import Trajectory, token_logprobs
from protege.rl.estimators.base import Returns
from protege.rl.gtpo import add_final_turn_bonus
from protege.rl.guidance.base import Guidance, Step
from protege.rl.losses import merged_kl_penalty, thought_sft_loss
from protege.rl.merged_teacher import MergedTeacher, trainable_weights
from protege.train.runtime.placement import CPU, visiting
from protege.world.envs import action_start

TEACHER_DIR = "merged-teacher"


@dataclass
class ThoughtBatch:
    batch: Trajectory
    contexts: int          # observations the merged teacher answered
    parsed: int            # of which with a parseable action (the others teach nothing)


def merged_thoughts(teacher, processor: StudentProcessor, eps: list[Episode], k: int, sampling: Sampling,
                    rng: random.Random, device: torch.device) -> ThoughtBatch | None:
    """GTR-Turbo `sft`: the merged teacher writes its own output for k observations of this step's episodes
    (the same contexts the policy answered); the tokens before its action are the targets."""
    turns = [(i, j) for i, e in enumerate(eps) for j in range(e.turns)]
    picked = rng.sample(turns, min(k, len(turns)))
    contexts = [eps[i].prefix(j) for i, j in picked]
    batch = {key: v.to(device) for key, v in prompt_batch(processor, contexts).items()}
    out = complete(teacher, processor, batch, [ims for _, ims in contexts], sampling)
    tok = processor.tokenizer
    rows, parsed = [], 0
    for r, (ids, images) in enumerate(contexts):
        gen = out.sequences[r, out.prompt_len:][out.completion_mask[r].bool()].tolist()
        body = gen[:-1] if gen and gen[-1] in processor.stop_token_ids else gen
        cut = action_start(tok.decode(body))
        n_thought = 0
        if cut is not None:
            parsed += 1
            while n_thought < len(body) and len(tok.decode(body[:n_thought + 1])) <= cut:
                n_thought += 1
        seq = ids + gen
        rows.append((seq, [0] * len(ids) + [1] * n_thought + [0] * (len(gen) - n_thought), [0] * len(seq), images))
    if not parsed:
        return None
    return ThoughtBatch(pack(processor, rows).to(device), len(contexts), parsed)


class MergedTeacherGuidance(Guidance):
    """`teacher` is a plain copy of the starting policy (merged_teacher.teacher_copy), made before the policy
    moves to its device; `policy` is the policy after its trainable parameters were chosen."""

    def __init__(self, teacher: torch.nn.Module, policy: torch.nn.Module, gtr, processor: StudentProcessor,
                 sampling: Sampling, rng: random.Random, device: torch.device):
        self.teacher, self.gtr, self.processor, self.sampling, self.rng = teacher, gtr, processor, sampling, rng
        self.offload = device != CPU
        self.merged = MergedTeacher(trainable_weights(policy), gtr.merge, gtr.ema_alpha, gtr.ties_density)
        self.parts = {"merged_teacher": self.merged}

    def resumed(self) -> None:
        self.merged.load_into(self.teacher)

    def shape(self, step: Step, returns: Returns) -> Returns:
        # the penalty is measured (and logged) under `sft` too; only `kl` takes it off the reward
        with torch.no_grad(), visiting(self.teacher, step.device, self.offload):
            logp_m = token_logprobs(self.teacher, step.batch)
        logp, mask = step.logp.detach(), step.mask
        penalty = merged_kl_penalty(logp, logp_m, mask, self.gtr.kl_clamp, step.batch.owner,
                                    len(step.episodes)).cpu()  # [E]
        step.metrics["kl_merged"] = float(((logp - logp_m) * mask).sum() / mask.sum().clamp(min=1))
        step.metrics["kl_penalty"] = float(penalty.mean())
        if self.gtr.guidance != "kl":
            return returns
        cost = self.gtr.kl_coef * penalty
        return replace(returns, turn=add_final_turn_bonus(returns.turn, returns.valid, -cost),
                       total=None if returns.total is None else returns.total - cost)

    def loss(self, step: Step) -> torch.Tensor | None:
        if self.gtr.guidance != "sft":
            return None
        with visiting(self.teacher, step.device, self.offload):
            thoughts = merged_thoughts(self.teacher, self.processor, step.episodes, self.gtr.sft_contexts,
                                       self.sampling, self.rng, step.device)
        if thoughts is None:
            return None
        sft = thought_sft_loss(token_logprobs(step.policy, thoughts.batch), thoughts.batch.loss_mask.float())
        step.metrics.update(sft_loss=float(sft.detach()), teacher_parse_rate=thoughts.parsed / thoughts.contexts)
        return self.gtr.sft_coef * sft

    def after_update(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        self.merged.add(trainable_weights(policy))
        self.merged.load_into(self.teacher)
        metrics["merge_s"] = self.merged.seconds

    def finish(self, out_dir: Path, processor) -> None:
        save_student(self.teacher, processor, out_dir / TEACHER_DIR)
