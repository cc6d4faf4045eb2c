"""The question loop: `grpo`, `dr_grpo` and `ril`.

Per step, per question: G student samples from pi_old; for `ril` also G cached teacher answers drawn across
teachers, mu_d discriminator updates on the 2G, reward = w_sim * similarity + w_answer * judge; group-relative
advantages; one clipped policy update with a k3 KL to pi_ref. The step's phases are rl/step.py's; the questions,
the judge and the advantage per answer rollouts/questions.py's; RIL's discriminator reward
guidance/discriminator.py's; the clipped surrogate objectives/clipped.py's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from protege.config import RLConfig, result_params
from protege.data.rows import Row
from protege.errors import UserFacingError
from protege.models.processor import StudentProcessor
from protege.rl.guidance.base import Guidance
from protege.rl.guidance.discriminator import DiscriminatorSimilarity
from protege.rl.rollouts.questions import Questions
from protege.rl.session import open_session
from protege.rl.step import train
from protege.runtime.state import fingerprint as state_fingerprint


@dataclass
class RLInputs:
    rows: list[Row]
    teacher_answers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # question id -> (teacher, text)
    discriminator: torch.nn.Module | None = None
    judge: Callable[[list[str], list[str], list[str]], list[float]] | None = None  # None: the rule-based judge
    # the learning curve: called as evaluator(step, policy) at step 0, every rl.eval_every steps and at the last
    # step, on every rank (each answers its share); `policy` is the generation engine where one samples (awake,
    # with the step's weights). It must not sample: greedy decoding leaves the run's random generators untouched
    evaluator: Callable[[int, torch.nn.Module], None] | None = None
    max_prompt_tokens: int | None = None  # the longest a question's prompt may be (sizes a vLLM engine's context)


def fingerprint(cfg: RLConfig, seed: int, inputs_digest: str = "") -> str:
    """Identifies the run a resume state belongs to: a state from other params or other inputs (the
    caller's digest of the starting checkpoint and data) is never resumed.

    The settings are those config.py marks as changing results (`result_params`): not `steps` (the learning
    rate is constant, so raising rl.steps continues a finished run, `resumable`), nor placement or the save
    cadence. The learning curve's settings count: a finished run would otherwise keep a curve drawn under
    other ones. So does the number of processes (each holds its own optimizer partition and RNG).
    """
    return state_fingerprint(result_params(cfg), seed, inputs_digest)


def guidance_terms(cfg: RLConfig, inputs: RLInputs, processor: StudentProcessor,
                   device: torch.device) -> list[Guidance]:
    """The question loop's guidance terms, in the order they shape the rewards: RIL's discriminator similarity."""
    return [DiscriminatorSimilarity(inputs.discriminator, cfg, processor, device)] if cfg.algorithm == "ril" else []


def _rollout_engine(cfg: RLConfig, policy, processor: StudentProcessor, updater, seed: int, rank: int,
                    world_size: int, start: int, max_prompt_tokens: int | None, rows: list[Row]):
    """The policy (transformers) or a vLLM engine serving its weights, one per process. A resumed run seeds its
    engine anew (from the step it resumes at): exact resume holds for transformers sampling only.
    The engine's context is rl.vllm_max_model_len, or the longest prompt the questions may have plus
    max_new_tokens; it reports each sampled token's log-prob when rl.rollout_correction asks for them."""
    if cfg.generation == "transformers":
        return policy
    from protege.generation.vllm_backend import generator_from_model, image_limit

    # several processes: each engine joins the launcher's process group and stays on its own device
    extra = {"distributed_executor_backend": "external_launcher"} if world_size > 1 else {}
    length = cfg.vllm_max_model_len or (max_prompt_tokens + cfg.max_new_tokens if max_prompt_tokens else None)
    if not length:
        raise UserFacingError("rl.generation 'vllm' needs the engine's context: set rl.vllm_max_model_len (prompt + "
                              "answer tokens)")
    with updater.gathered():
        return generator_from_model(policy, processor, seed=seed * 1_000_003 + rank * 1009 + start,
                                    memory=cfg.vllm_memory, sleep=cfg.vllm_sleep, max_model_len=length,
                                    images_per_prompt=image_limit(policy, [r.image_count for r in rows]),
                                    logprobs=cfg.rollout_correction == "tis", **extra)


def run_rl(policy, ref, processor: StudentProcessor, inputs: RLInputs, cfg: RLConfig, out_dir: Path, seed: int,
           on_log: Callable[[int, dict], None] | None = None, state_dir: Path | None = None,
           stop_after: int | None = None, inputs_digest: str = "",
           on_state_saved: Callable[[int], None] | None = None) -> list[Path]:
    """Trains `policy` in place (`ref` = frozen SFT model; None for a LoRA policy, whose reference is itself with
    its adapters disabled). Returns the checkpoint folders written.

    With `state_dir`, the full training state is saved every `save_every` steps and a matching state
    found there is resumed from, reaching the same weights as an uninterrupted run.
    `stop_after` ends the run early after that step (used to test resume); `on_state_saved(step)` runs
    after each state save.
    """
    rollout = Questions(cfg, inputs, processor, lambda *a: _rollout_engine(*a))
    session = open_session(policy, ref, processor, cfg, "rl", seed=seed, out_dir=out_dir,
                           fingerprint=fingerprint(cfg, seed, inputs_digest),
                           guidance=lambda policy, device, rng: guidance_terms(cfg, inputs, processor, device),
                           state_dir=state_dir, on_saved=on_state_saved, on_log=on_log, stop_after=stop_after)
    return train(session, rollout)
