"""RL on multi-turn games (the visual grid game, the tool-use environment), optionally guided by GTR-Turbo's
merged teacher, with episode-level (GRPO / Dr.GRPO) or turn-level (GTPO) advantages.

Per step: a few fresh layouts (questions), each played `group_size` times by the policy (multi-turn episodes:
an image observation per turn, or a tool's output as the next turn); rewards per turn. grpo / dr_grpo: the
episode's return (minus GTR-Turbo's KL penalty under `gtr.guidance: kl`) gives one group-relative advantage
carried by every token the policy wrote. gtpo: failed episodes get a bonus for code like the group's
successful code, each turn's discounted return is normalised over the group (or batch), and each turn's
tokens carry their turn's advantage. One clipped update, plus under `gtr.guidance: sft` a cross-entropy on
the thoughts the merged teacher writes for observations of this step; then the updated weights join the
merged teacher. Read top to bottom: this is the whole algorithm. The math lives in advantages.py, gtpo.py
and losses.py, the episodes in episodes.py, the games in games.py, the merge in merged_teacher.py.
"""
from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from protege.config import result_params
from protege.generation.transformers_backend import Sampling, complete
from protege.models.lora import is_lora
from protege.models.processor import StudentProcessor
from protege.models.student import save_student
from protege.paths import checkpoints
from protege.rl.code_similarity import make_embedder
from protege.rl.episodes import Episode, EpisodeBatch, batch_to, pack, pack_episodes, play, prompt_batch, sequence_logprobs
from protege.rl.games import Game, env_factory, max_turns, sampling_for
from protege.rl.estimators import Returns, estimator
from protege.rl.gtpo import add_final_turn_bonus, similarity_shaping, token_advantages
from protege.rl.losses import merged_kl_penalty, policy_loss, thought_sft_loss
from protege.rl.merged_teacher import MergedTeacher, teacher_copy, trainable_weights
from protege.rl.reference import reference
from protege.rl.trainable import select_trainable
from protege.train.runtime.distributed import one_process
from protege.train.runtime.placement import CPU, resolve_device, visiting
from protege.train.runtime.run import Run, due
from protege.train.runtime.state import OptimizerState, TorchRNG, Weights, fingerprint
from protege.train.runtime.updaters import make_updater
from protege.world.envs import EVAL_SEED_OFFSET, action_start, train_seed


def agent_fingerprint(cfg: Game, seed: int, inputs_digest: str = "") -> str:
    """Identifies the run a resume state belongs to: the settings config.py marks as changing results. Raising
    rl.steps continues a finished run (constant LR); the final evaluation and the save cadence do not count."""
    return fingerprint(result_params(cfg), seed, inputs_digest)


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return out_dir / f"step-{step:05d}"


@dataclass
class ThoughtBatch:
    batch: EpisodeBatch
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
    return ThoughtBatch(batch_to(pack(processor, rows), device), len(contexts), parsed)


def turn_rewards(eps: list[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn rewards, right-padded: [E, Tmax] rewards and [E, Tmax] bool, True on the episode's turns."""
    T = max(len(e.rewards) for e in eps)
    rewards = torch.zeros(len(eps), T)
    valid = torch.zeros(len(eps), T, dtype=torch.bool)
    for i, e in enumerate(eps):
        rewards[i, :len(e.rewards)] = torch.tensor(e.rewards)
        valid[i, :len(e.rewards)] = True
    return rewards, valid


def episode_code(ep: Episode) -> str:
    """Every code block the episode ran, in order (GTPO compares failed episodes' code to successful ones')."""
    return "\n".join(i["code"] for i in ep.infos if i.get("code"))


def rollout_metrics(eps: list[Episode]) -> dict[str, float]:
    """What the step's sampled episodes did; tool metrics where the game reports tool calls."""
    turns = [i for e in eps for i in e.infos]
    m = {"success_rate": sum(e.success for e in eps) / len(eps),
         "format_error_rate": sum(not i.get("legal", True) for i in turns) / max(len(turns), 1),
         "turns_per_episode": len(turns) / len(eps)}
    if any("tool_call" in i for i in turns):
        calls = sum(bool(i.get("tool_call")) for i in turns)
        m.update(accuracy=m["success_rate"], tool_calls_per_episode=calls / len(eps),
                 runtime_error_rate=sum(any(i.get("runtime_error") for i in e.infos) for e in eps) / len(eps),
                 runtime_errors_per_call=sum(bool(i.get("runtime_error")) for i in turns) / max(calls, 1))
    return m


def run_agent_rl(policy, processor: StudentProcessor, cfg: Game, image_size: int, out_dir: Path, seed: int,
                 on_log: Callable[[int, dict], None] | None = None, state_dir: Path | None = None,
                 stop_after: int | None = None, inputs_digest: str = "",
                 on_state_saved: Callable[[int], None] | None = None,
                 new_env: Callable[[], object] | None = None) -> list[Path]:
    """Trains `policy` in place; returns the checkpoint folders written (`out_dir/step-NNNNN`; with GTR-Turbo
    also `out_dir/merged-teacher`, the teacher after the last update). With `state_dir` the whole training
    state (merged teacher included) is saved every `save_every` steps and resumed from when it matches.
    `new_env` builds an environment (default: the configured game), any with reset(seed) / step(text)."""
    rl, gtr = cfg.rl, cfg.rl.gtr
    one_process("agent and tool RL")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    device = resolve_device(rl.device, "agent.rl.device")
    advantage = estimator(rl)
    G = rl.group_size
    new_env = new_env or env_factory(cfg, image_size)
    gtpo = rl.gtpo if rl.algorithm == "gtpo" else None
    embed = make_embedder(gtpo.embedder) if gtpo is not None and gtpo.shaping_alpha > 0 else None
    # a LoRA policy's KL reference is itself with adapters disabled (no second copy)
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if rl.kl_beta > 0 and not is_lora(policy) else None
    teacher = teacher_copy(policy) if gtr.guidance != "none" else None
    policy.to(device)
    params = select_trainable(policy, rl.trainable)
    updater = make_updater("torch", policy, params, rl.lr, 2, device, key="agent.rl")  # constant LR
    merged = (MergedTeacher(trainable_weights(policy), gtr.merge, gtr.ema_alpha, gtr.ties_density)
              if teacher is not None else None)
    parts = {"policy": Weights(updater), "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    if merged is not None:
        parts["merged_teacher"] = merged
    sampling = sampling_for(cfg, do_sample=True, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
    L_max = rl.max_new_tokens * max_turns(cfg)  # Dr.GRPO's constant denominator: the longest possible episode
    run = Run(state_dir, parts, rng, agent_fingerprint(cfg, seed, inputs_digest), rl.steps, on_saved=on_state_saved)
    start, _ = run.resume()
    saved = checkpoints(out_dir) if start > 1 else []
    if start > 1 and merged is not None:
        merged.load_into(teacher)

    step = start - 1
    for step in range(start, rl.steps + 1):
        t0 = time.perf_counter()
        # 1. fresh layouts, each played G times
        layouts = [train_seed(rng.randrange(EVAL_SEED_OFFSET)) for _ in range(rl.seeds_per_step)]
        seeds = [s for s in layouts for _ in range(G)]

        # 2. multi-turn episodes from pi_old (= the current policy), all at once
        t_roll = time.perf_counter()
        eps = play(policy, processor, [new_env() for _ in seeds], seeds, sampling, device=device, context=cfg.context)
        rollout_s = time.perf_counter() - t_roll
        batch = batch_to(pack_episodes(processor, eps), device)
        mask = batch.loss_mask.float()  # [N, T-1] the policy's own tokens (N rows: episodes, or their turns)
        owner = batch.owner  # [N] the episode of each row
        logp, entropy = sequence_logprobs(policy, batch, with_entropy=True)  # [N, T-1] each

        # 3. rewards: the episode's return; GTR-Turbo `kl` subtracts the clamped KL to the merged teacher
        returns = torch.tensor([e.total_reward for e in eps])  # [E]
        metrics: dict[str, float] = {}
        rewards = returns
        penalty = None
        if merged is not None:
            with torch.no_grad(), visiting(teacher, device, device != CPU):
                logp_m = sequence_logprobs(teacher, batch)
            penalty = merged_kl_penalty(logp.detach(), logp_m, mask, gtr.kl_clamp, owner, len(eps)).cpu()  # [E]
            metrics["kl_merged"] = float(((logp.detach() - logp_m) * mask).sum() / mask.sum().clamp(min=1))
            metrics["kl_penalty"] = float(penalty.mean())
            if gtr.guidance == "kl":
                rewards = returns - gtr.kl_coef * penalty

        # 4. per-turn rewards (gtpo: + the similarity bonus of failed episodes, and the KL penalty, on the last
        # turn), then the estimator's advantage per (episode, turn), spread over that turn's tokens
        r_turn, valid = turn_rewards(eps)  # [E, Tmax] each
        if gtpo is not None:
            bonus = (similarity_shaping([episode_code(e) for e in eps], [e.success for e in eps], G,
                                        gtpo.shaping_alpha, embed) if embed is not None else torch.zeros(len(eps)))
            r_turn = add_final_turn_bonus(r_turn, valid, bonus)  # [E, Tmax]
            failed = [not e.success for e in eps]
            metrics["shaping_reward_mean"] = float(bonus[torch.tensor(failed)].mean()) if any(failed) else 0.0
        if penalty is not None and gtr.guidance == "kl":
            r_turn = add_final_turn_bonus(r_turn, valid, -gtr.kl_coef * penalty)
        if gtpo is not None:
            rewards = (r_turn * valid).sum(1)  # [E] what the episode was credited with
        adv_turn = advantage(Returns(rewards, r_turn, valid, G), rl)  # [E, Tmax]
        adv_tokens = token_advantages(adv_turn.to(device), owner, batch.turn, mask)  # [N, T-1]

        # 5. loss terms: clipped surrogate (+ k3 KL to the SFT policy); GTR-Turbo `sft`: CE on merged thoughts
        if rl.kl_beta > 0:
            with torch.no_grad(), reference(policy, ref, device, device != CPU) as frozen:
                logp_ref = sequence_logprobs(frozen, batch)
        else:
            logp_ref = logp.detach()
        loss, stats = policy_loss(logp, logp.detach(), logp_ref, adv_tokens, mask, clip_eps=rl.clip_eps,
                                  kl_beta=rl.kl_beta, max_len=L_max,
                                  # gtpo averages each sequence's tokens as grpo does
                                  aggregation="dr_grpo" if rl.algorithm == "dr_grpo" else "grpo")
        if gtr.guidance == "sft":
            with visiting(teacher, device, device != CPU):
                thoughts = merged_thoughts(teacher, processor, eps, gtr.sft_contexts, sampling, rng, device)
            if thoughts is not None:
                sft = thought_sft_loss(sequence_logprobs(policy, thoughts.batch), thoughts.batch.loss_mask.float())
                loss = loss + gtr.sft_coef * sft
                metrics.update(sft_loss=float(sft.detach()), teacher_parse_rate=thoughts.parsed / thoughts.contexts)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"agent RL loss is {loss.item()} at step {step}; last good checkpoint: "
                                     f"{saved[-1] if saved else 'none (the starting model)'}")

        # 6. update; the new weights join the merged teacher
        updater.update(loss)
        if merged is not None:
            merged.add(trainable_weights(policy))
            merged.load_into(teacher)
            metrics["merge_s"] = merged.seconds
        seconds = time.perf_counter() - t0

        # 7. checkpoint and training state
        if due(step, rl.save_every, rl.steps):
            saved.append(checkpoint_dir(out_dir, step))
            save_student(policy, processor, saved[-1])
            run.save(step, {})
        if on_log:
            n_tok = float(mask.sum())
            metrics.update(rollout_metrics(eps))
            metrics.update({
                "entropy": float((entropy.detach() * mask).sum() / max(n_tok, 1.0)),
                "reward": float(rewards.mean()), "return": float(returns.mean()),
                "loss": float(loss.detach()), "kl_ref": float(stats["kl"]),
                "clip_fraction": float(stats["clip_fraction"]), "rollout_s": rollout_s, "step_s": seconds,
                "tokens_per_episode": n_tok / len(eps)})
            on_log(step, metrics)
        if stop_after is not None and step >= stop_after:
            break
    if merged is not None and step >= rl.steps:
        save_student(teacher, processor, out_dir / "merged-teacher")
    return saved
