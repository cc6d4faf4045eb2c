"""What an RL run sets up once and brings back on resume, for both loops: the policy on its device, the
reference, the objective (and what it trains beside the policy), the guidance terms, the updater, the
resumable parts, the `Run` and the micro-batch budget. The setup draws from the random generators in one
fixed order, so a run with the same seed and settings starts from the same numbers whichever loop it is."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from protege.paths import checkpoints
from protege.rl.estimators import estimator
from protege.rl.guidance.base import Guidance
from protege.rl.objectives import make_objective
from protege.rl.objectives.base import Objective
from protege.rl.trainable import select_trainable
from protege.runtime.distributed import barrier, world
from protege.runtime.micro import budget_tokens
from protege.runtime.placement import CPU, resolve_device
from protege.runtime.run import Run
from protege.runtime.schedule import lr_lambda_for
from protege.runtime.state import OptimizerState, TorchRNG, Weights
from protege.runtime.updaters import make_updater


@dataclass
class Session:
    cfg: object                 # the loop's RL section (rl, agent.rl or tool.rl)
    section: str                # its name in messages
    policy: torch.nn.Module
    ref: torch.nn.Module | None  # the frozen KL reference; None: none, or a LoRA policy with adapters off
    processor: object
    device: torch.device
    seed: int
    rng: random.Random
    objective: Objective
    guidance: list[Guidance]
    updater: object
    advantage: Callable         # the estimator: (returns, cfg) -> [E, T]
    tokens_per_forward: int
    run: Run
    out_dir: Path
    rank: int = 0
    world_size: int = 1
    offload_ref: bool = True
    start: int = 1              # the first step to run (> 1 after a resume)
    cursor: dict = field(default_factory=dict)
    saved: list[Path] = field(default_factory=list)
    on_log: Callable[[int, dict], None] | None = None
    stop_after: int | None = None


def open_session(policy, ref, processor, cfg, section: str, *, seed: int, out_dir: Path, fingerprint: str,
                 guidance: Callable[[torch.nn.Module, torch.device, random.Random], list[Guidance]] = lambda *a: [],
                 objective_context: dict | None = None, state_dir: Path | None = None,
                 on_saved: Callable[[int], None] | None = None, on_log=None, stop_after: int | None = None) -> Session:
    """Sets the run up and resumes it from a matching state in `state_dir`. `guidance(policy, device, rng)` makes
    the guidance terms (before the updater: the merged teacher starts from whole weights that ZeRO-3 then
    partitions); `objective_context`: what the objective may read besides the section (objectives/__init__.py)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rank, world_size = world()
    device = resolve_device(cfg.device, f"{section}.device")
    if ref is None and cfg.trainable != "lora" and cfg.kl_beta > 0:
        raise ValueError(f"{section}.kl_beta > 0 needs a reference model unless {section}.trainable is lora")
    offload_ref = getattr(cfg, "offload_idle", True)  # the multi-turn sections have no setting: it visits
    policy.to(device)
    if ref is not None:
        ref.eval().requires_grad_(False).to(CPU if offload_ref else device)
    params = select_trainable(policy, cfg.trainable)
    objective = make_objective(cfg, policy, device, **(objective_context or {}))
    terms = guidance(policy, device, rng)
    # constant by default (RIL's static rate); the schedule counts RL steps: the optimizer steps of one RL step
    # (its epochs times its mini-batches) share a rate
    beside = objective.modules()  # PPO's value head: in the DeepSpeed engine with the policy
    updater = make_updater(cfg.backend, policy, params + objective.parameters(), cfg.lr, cfg.zero_stage, device,
                           key=f"{section}.backend", clip=objective.max_grad_norm,
                           lr_lambda=lr_lambda_for(cfg, objective.epochs * objective.mini_batches),
                           beside=beside)
    # what exact resume brings back, by name (the file names of a state folder), loaded in this order: every
    # weight before the optimizer, whose saved fp32 masters DeepSpeed's refresh from the weights must not undo
    parts = {"policy": Weights(updater), **{name: Weights(updater.weights_of(m)) for name, m in beside.items()},
             "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    for term in terms:
        parts.update(term.parts)
    run = Run(state_dir, parts, rng, fingerprint, cfg.steps, rank=rank, world_size=world_size, barrier=barrier,
              on_saved=on_saved)
    start, cursor = run.resume()
    for term in terms if start > 1 else []:
        term.resumed()
    return Session(cfg, section, policy, ref, processor, device, seed, rng, objective, terms, updater, estimator(cfg),
                   budget_tokens(cfg.micro_batch_tokens, policy, device), run, out_dir, rank, world_size, offload_ref,
                   start, cursor, checkpoints(out_dir) if start > 1 else [], on_log, stop_after)
