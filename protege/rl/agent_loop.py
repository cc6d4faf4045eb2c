"""RL on multi-turn games (the visual grid game, the tool-use environment), optionally guided by GTR-Turbo's
merged teacher, with episode-level (GRPO / Dr.GRPO), turn-level (GTPO) or value-based (PPO) advantages.

Per step: a few fresh layouts (questions), each played `group_size` times by the policy (multi-turn episodes:
an image observation per turn, or a tool's output as the next turn); rewards per turn, minus GTR-Turbo's
per-turn KL to the merged teacher over the turn's thought tokens under `gtr.guidance: kl`. grpo / dr_grpo:
the episode's return gives one group-relative advantage carried by every token the policy wrote. gtpo:
failed episodes get a bonus for code like the group's successful code, each turn's discounted return is
normalised over turn j of the group (or the group, or the batch), and each turn's tokens carry their turn's
advantage. ppo: a value head on the policy gives each turn's V, GAE over the turns gives each turn's
advantage, normalised over the batch. One clipped update (ppo: `ppo.epochs` of them, with the value loss),
plus under `gtr.guidance: sft` a cross-entropy on the thoughts the merged teacher writes for observations of
this step; then the updated weights join the merged teacher. The step's phases are rl/step.py's; the
layouts, episodes and per-turn advantages rollouts/episodes.py's; the update rules objectives/ (PPO's value
head and GAE objectives/ppo.py); the guidance terms (GTPO's shaping, GTR-Turbo's merged teacher) guidance/.
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from protege.config import result_params
from protege.models.lora import is_lora
from protege.models.processor import StudentProcessor
from protege.rl.guidance.base import Guidance
from protege.rl.guidance.merged_teacher import MergedTeacherGuidance
from protege.rl.guidance.shaping import SimilarityShaping
from protege.rl.merged_teacher import teacher_copy
from protege.rl.rollouts.episodes import Episodes
from protege.rl.session import open_session
from protege.rl.step import train
from protege.rollout.games import Game, action_start_for, is_tool
from protege.runtime.state import fingerprint


def agent_fingerprint(cfg: Game, seed: int, inputs_digest: str = "") -> str:
    """Identifies the run a resume state belongs to: the settings config.py marks as changing results. Raising
    rl.steps continues a finished run under a constant LR; under a cosine schedule the step count shapes every
    step's rate, so it counts. The final evaluation and the save cadence do not count."""
    length = {"steps": cfg.rl.steps} if cfg.rl.schedule != "constant" else {}
    return fingerprint({**result_params(cfg), **length}, seed, inputs_digest)


def guidance_terms(rl, teacher: torch.nn.Module | None, policy: torch.nn.Module, processor, sampling,
                   rng: random.Random, device: torch.device, action_start=None) -> list[Guidance]:
    """In the order they shape the rewards: GTPO's shaping first, then the merged teacher's KL penalty.
    `teacher` is the starting policy's copy when rl.gtr.guidance is not none; `action_start` is the game's
    (where a thought ends; None: the grid game's)."""
    terms: list[Guidance] = []
    if rl.algorithm == "gtpo":
        terms.append(SimilarityShaping(rl.gtpo.shaping_alpha, rl.gtpo.embedder))
    if teacher is not None:
        teaching = replace(sampling, temperature=rl.gtr.teacher_temperature, top_k=rl.gtr.teacher_top_k)
        terms.append(MergedTeacherGuidance(teacher, policy, rl.gtr, processor, teaching, rng, device, action_start))
    return terms


def run_agent_rl(policy, processor: StudentProcessor, cfg: Game, image_size: int, out_dir: Path, seed: int,
                 on_log: Callable[[int, dict], None] | None = None, state_dir: Path | None = None,
                 stop_after: int | None = None, inputs_digest: str = "",
                 on_state_saved: Callable[[int], None] | None = None,
                 new_env: Callable[[], object] | None = None) -> list[Path]:
    """Trains `policy` in place; returns the checkpoint folders written (`out_dir/step-NNNNN`; with GTR-Turbo
    also `out_dir/merged-teacher`, the teacher after the last update). With `state_dir` the whole training
    state (merged teacher included) is saved every `save_every` steps and resumed from when it matches.
    `new_env` builds an environment (default: the configured game), any with reset(seed) / step(text)."""
    rl = cfg.rl
    rollout = Episodes(cfg, image_size, processor, new_env)
    # a LoRA policy's KL reference is itself with adapters disabled (no second copy)
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if rl.kl_beta > 0 and not is_lora(policy) else None
    teacher = teacher_copy(policy) if rl.gtr.guidance != "none" else None
    action_start = action_start_for(cfg)
    session = open_session(
        policy, ref, processor, rl, f"{'tool' if is_tool(cfg) else 'agent'}.rl", seed=seed, out_dir=out_dir,
        fingerprint=agent_fingerprint(cfg, seed, inputs_digest),
        guidance=lambda policy, device, rng: guidance_terms(rl, teacher, policy, processor, rollout.sampling, rng,
                                                            device, action_start=action_start),
        objective_context={"processor": processor, "action_start": action_start}, state_dir=state_dir,
        on_saved=on_state_saved, on_log=on_log, stop_after=stop_after)
    return train(session, rollout)
