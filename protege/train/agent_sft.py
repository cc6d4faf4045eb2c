"""Warm start for agent RL (the agent game, grid or points24, or the tool environment): supervised training on the scripted
solver's multi-turn episodes.

An expert episode is laid out exactly as a played one (protege.rollout.episodes): observations as user turns,
the solver's "thought + action" as the assistant's; the loss is the cross-entropy on the assistant tokens.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from protege.config import AgentConfig, result_params
from protege.models.processor import StudentProcessor
from protege.rollout.episodes import Episode, add_observation, add_policy_turn, pack, start_episode
from protege.rollout.games import Game, expert_episodes
from protege.rollout.trajectory import thought_sft_loss, token_logprobs
from protege.runtime.micro import budget_tokens, length_groups
from protege.runtime.distributed import one_process
from protege.runtime.placement import resolve_device
from protege.runtime.run import Run, due, next_rows
from protege.runtime.state import OptimizerState, TorchRNG, Weights, fingerprint
from protege.runtime.updaters import make_updater
from protege.world.envs import GridParams


def grid_params(cfg: AgentConfig, image_size: int) -> GridParams:
    return GridParams(image_size=image_size, **cfg.grid.model_dump())


def expert_as_episode(processor: StudentProcessor, turns, context: str = "full") -> Episode:
    """(observation, solver text) per turn -> the episode as the policy would have played it (`context`
    as in protege.rollout.episodes.play)."""
    tok, eos = processor.tokenizer, processor.eos_token_id
    if context == "current":
        parts = [expert_as_episode(processor, [turn]) for turn in turns]
        return Episode(ids=[], loss_mask=[], turn_of=[], per_turn=parts, texts=[t for _, t in turns])
    ep = start_episode(processor, turns[0][0])
    for j, (obs, text) in enumerate(turns):
        if j:
            add_observation(processor, ep, obs)
        add_policy_turn(ep, tok(text, add_special_tokens=False)["input_ids"] + [eos], text, eos)
    return ep


def sft_fingerprint(cfg: Game, image_size: int, seed: int, inputs_digest: str = "") -> str:
    """What a warm start's result depends on: its own settings, the game that writes its episodes, the
    image size and the seed (logging and saving excluded)."""
    # the agent game's own section (agent.grid, agent.points24); the tool game's is its task
    game = cfg.model_dump(include={"env", "context", cfg.env, "task", "solver_slips"})
    return fingerprint({"sft": result_params(cfg.sft), "game": game,
                        "image_size": image_size}, seed, inputs_digest)


def train_agent_sft(model, processor: StudentProcessor, cfg: Game, image_size: int, seed: int,
                    device_name: str = "auto", on_log: Callable[[int, dict], None] | None = None, *,
                    state_dir=None, inputs_digest: str = "", stop_after: int | None = None) -> dict:
    """Trains `model` in place on `cfg.sft.episodes` expert episodes (train seeds 0..episodes-1), in batches
    of `batch_size` rows: single turns under context "current" (i.i.d. across layouts), else whole episodes.
    With `state_dir` it saves its training state every `sft.save_every` steps and resumes from a state of
    this very run (bitwise the weights of an uninterrupted run); `stop_after` ends it early (tests)."""
    sft = cfg.sft
    one_process("the agent and tool warm starts")
    episodes = [expert_as_episode(processor, turns, cfg.context)
                for turns in expert_episodes(cfg, image_size, sft.episodes)]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    device = resolve_device(device_name, "agent.sft.device")
    model.to(device).train()
    updater = make_updater("torch", model, [p for p in model.parameters() if p.requires_grad], sft.lr, 2, device,
                           key="agent.sft")
    tokens = budget_tokens(sft.micro_batch_tokens, model, device)
    parts = {"model": Weights(updater), "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    run = Run(state_dir, parts, rng, sft_fingerprint(cfg, image_size, seed, inputs_digest), sft.steps)
    rows = [row for e in episodes for row in e.rows()]  # a turn each under context "current", else an episode
    start, cursor = run.resume()
    order: list[int] = cursor.get("order", [])
    last: dict = cursor.get("last", {})
    t0 = time.perf_counter()
    for step in range(start, sft.steps + 1):
        idx, order = next_rows(order, len(rows), sft.batch_size, rng)
        batch = pack(processor, [rows[i] for i in idx])
        n_tok = float(batch.loss_mask.sum())
        loss = torch.zeros((), device=device)
        # CE on the solver's turns, a token mean; micro-batches of rows of like length (episodes differ)
        for rows_ in length_groups(batch.inputs["attention_mask"].sum(dim=1).tolist(), tokens):
            part = (batch if len(rows_) == batch.n else batch.select(rows_, processor)).trimmed(processor).to(device)
            share = thought_sft_loss(token_logprobs(model, part), part.loss_mask.float(), tokens=n_tok)
            updater.backward(share)
            loss += share.detach()
        updater.step()
        last = {"loss": float(loss.detach()), "seconds": time.perf_counter() - t0}
        if on_log and due(step, sft.log_every, sft.steps):
            on_log(step, last)
        if due(step, sft.save_every, sft.steps):
            run.save(step, {"order": order, "last": last})
        if stop_after is not None and step >= stop_after:
            break
    return {"episodes": len(episodes), "turns": sum(e.turns for e in episodes), "resumed_after_step": start - 1,
            **last}
