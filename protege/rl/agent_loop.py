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
this step; then the updated weights join the merged teacher. Read top to bottom: this is the whole
algorithm. The advantages live in estimators/, the guidance terms (GTPO's shaping, GTR-Turbo's merged
teacher) in guidance/, the losses in losses.py, PPO's value head and GAE in ppo.py, the episodes in
episodes.py, the games in games.py.
"""
from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from protege.config import result_params
from protege.models.lora import is_lora
from protege.models.processor import StudentProcessor
from protege.models.student import save_student
from protege.paths import checkpoint_dir, checkpoints
from protege.rollout.episodes import Episode, pack_episodes, play
from protege.rl.estimators import Returns, estimator
from protege.rollout.games import Game, action_start_for, env_factory, is_tool, max_turns, sampling_for
from protege.rl.gtpo import token_advantages
from protege.rl.guidance.base import Guidance, Step
from protege.rl.guidance.merged_teacher import MergedTeacherGuidance, thought_mask
from protege.rl.guidance.shaping import SimilarityShaping
from protege.rl.held_out import held_out_point
from protege.rl.losses import output_ratio_loss, policy_loss
from protege.rl.merged_teacher import teacher_copy
from protege.rl.ppo import ValueHead, gae, scored_with_values, turn_values, value_loss
from protege.rl.thought_stats import thought_metrics
from protege.rollout.reference import reference
from protege.rl.trainable import select_trainable
from protege.rollout.trajectory import score, token_logprobs
from protege.errors import UserFacingError
from protege.runtime.distributed import barrier, check_ranks_agree, mean_over_ranks, rows_per_rank, world
from protege.runtime.micro import budget_tokens, micro_batches
from protege.runtime.placement import CPU, resolve_device
from protege.runtime.run import Run, due
from protege.runtime.schedule import lr_factor
from protege.runtime.state import OptimizerState, TorchRNG, Weights, fingerprint
from protege.runtime.updaters import make_updater
from protege.world.envs import EVAL_SEED_OFFSET, train_seed


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


def turn_rewards(eps: list[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn rewards, right-padded: [E, Tmax] rewards and [E, Tmax] bool, True on the episode's turns."""
    T = max(len(e.rewards) for e in eps)
    rewards = torch.zeros(len(eps), T)
    valid = torch.zeros(len(eps), T, dtype=torch.bool)
    for i, e in enumerate(eps):
        rewards[i, :len(e.rewards)] = torch.tensor(e.rewards)
        valid[i, :len(e.rewards)] = True
    return rewards, valid


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
    rank, world_size = world()
    if rl.seeds_per_step < world_size:
        raise UserFacingError(f"seeds_per_step ({rl.seeds_per_step}) must be at least the number of processes "
                              f"({world_size}): each process plays its share of every step's layouts")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    device = resolve_device(rl.device, "agent.rl.device")
    advantage = estimator(rl)
    G = rl.group_size
    new_env = new_env or env_factory(cfg, image_size)
    # a LoRA policy's KL reference is itself with adapters disabled (no second copy)
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if rl.kl_beta > 0 and not is_lora(policy) else None
    teacher = teacher_copy(policy) if gtr.guidance != "none" else None
    policy.to(device)
    params = select_trainable(policy, rl.trainable)
    # the update, chosen here once: PPO or a group-relative one (grpo, dr_grpo, gtpo). PPO adds a value head on the
    # policy's last hidden state, trained beside it by the same optimizer (its loss joins the policy's, towards
    # GAE's targets), takes ppo.epochs optimizer steps per RL step at ppo.clip_eps, and under ppo.objective rl4vlm
    # takes one ratio per output; a group-relative update takes one step at rl.clip_eps
    ppo = rl.algorithm == "ppo"
    head = ValueHead(policy.config.get_text_config().hidden_size).to(device) if ppo else None
    epochs, clip_eps = (rl.ppo.epochs, rl.ppo.clip_eps) if ppo else (1, rl.clip_eps)
    sampling = sampling_for(cfg, do_sample=True, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                            repetition_penalty=rl.repetition_penalty)
    # RL4VLM's objective scores outputs at the sampling temperature (its ratio is on that distribution)
    per_output = ppo and rl.ppo.objective == "rl4vlm"
    ratio_t = rl.temperature if per_output else 1.0
    # before the updater: the merged teacher starts from the whole weights, which ZeRO-3 then partitions
    guidance = guidance_terms(rl, teacher, policy, processor, sampling, rng, device,
                              action_start=action_start_for(cfg))
    section = "tool" if is_tool(cfg) else "agent"
    # the schedule counts RL steps: PPO's ppo.epochs optimizer steps per RL step share one rate
    updater = make_updater(rl.backend, policy, params + (list(head.parameters()) if ppo else []), rl.lr,
                           rl.zero_stage, device, key=f"{section}.rl.backend",
                           clip=rl.ppo.max_grad_norm if ppo else 1.0,
                           lr_lambda=None if rl.schedule == "constant" and not rl.warmup_steps
                           else (lambda i: lr_factor(i // epochs, rl)))
    parts = {"policy": Weights(updater), "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    if ppo:
        parts["value_head"] = Weights(head)
    for term in guidance:
        parts.update(term.parts)
    tokens_per_forward = budget_tokens(rl.micro_batch_tokens, policy, device)
    L_max = rl.max_new_tokens * max_turns(cfg)  # Dr.GRPO's constant denominator: the longest possible episode
    run = Run(state_dir, parts, rng, agent_fingerprint(cfg, seed, inputs_digest), rl.steps, rank=rank,
              world_size=world_size, barrier=barrier, on_saved=on_state_saved)
    start, _ = run.resume()
    saved = checkpoints(out_dir) if start > 1 else []
    for term in guidance if start > 1 else []:
        term.resumed()

    step = start - 1
    for step in range(start, rl.steps + 1):
        t0 = time.perf_counter()
        # 1. fresh layouts, each played G times; every rank draws the step's layouts (the same RNG use
        #    everywhere) and plays its share: a layout's group stays on one rank
        layouts = [train_seed(rng.randrange(EVAL_SEED_OFFSET)) for _ in range(rl.seeds_per_step)]
        seeds = [s for s in layouts[rank::world_size] for _ in range(G)]

        # 2. multi-turn episodes from pi_old (= the current policy), all at once
        t_roll = time.perf_counter()
        with updater.gathered():  # ZeRO-3 partitions the weights: generation needs them whole
            eps = play(policy, processor, [new_env() for _ in seeds], seeds, sampling, device=device,
                       context=cfg.context)
        rollout_s = time.perf_counter() - t_roll
        batch = pack_episodes(processor, eps)  # N rows: episodes, or their turns (on the CPU; parts go to the device)
        spans = micro_batches(batch.n, batch.width, tokens_per_forward)
        parts = [(batch if len(span) == batch.n else batch.select(span, processor)).to(device) for span in spans]
        mask = batch.loss_mask.float().to(device)  # [N, T-1] the policy's own tokens
        n_tok = float(mask.sum())
        # the loss's rows are the whole step's across ranks: DeepSpeed averages the ranks' gradients, so each
        # rank's share divides its own sum by (all rows / ranks) and the average is the global batch's mean
        n_rows = rows_per_rank(batch.n)
        env_returns = torch.tensor([e.total_reward for e in eps])  # [E] each episode's return from the environment
        r_turn, valid = turn_rewards(eps)  # [E, Tmax] each
        E, T = r_turn.shape

        # pi_old: the policy that played the episodes scores them once, micro-batch by micro-batch (PPO: with V)
        with torch.no_grad():
            old = [scored_with_values(policy, head, part) if ppo
                   else (*token_logprobs(policy, part, with_entropy=True), None) for part in parts]
        logp_old = torch.cat([o[0] for o in old])  # [N, T-1]
        entropy = torch.cat([o[1] for o in old])  # [N, T-1]
        values = None  # [E, Tmax] PPO's V of each turn's state
        if ppo:
            values = turn_values(torch.cat([o[2] for o in old]).cpu(), batch, E, T)
        if per_output:  # one ratio per output: pi_old at the sampling temperature, each token's weight, its cell
            ratio_old = logp_old
            if ratio_t != 1.0:
                with torch.no_grad():
                    ratio_old = torch.cat([score(policy, part, temperature=ratio_t).logp for part in parts])
            thought = thought_mask(batch, processor, action_start_for(cfg)).to(device)  # [N, T-1]
            out_weights = mask * (1 - thought + rl.ppo.thought_weight * thought)
            cell = torch.where(mask.bool(), batch.owner.to(device).unsqueeze(1) * T + batch.turn.to(device).clamp(min=0),
                               torch.full_like(batch.turn.to(device), -1))  # [N, T-1] each token's (episode, turn)

        # 3. rewards per turn, returns per episode (the words: estimators/base.py); guidance terms shape them
        # (GTPO's similarity bonus for failed episodes on the last turn, GTR-Turbo `kl`'s clamped KL to the
        # merged teacher on each turn)
        metrics: dict[str, float] = {}
        seen = Step(policy, eps, batch, logp_old, mask, device, metrics, parts, tokens_per_forward)
        returns = Returns(r_turn, valid, G, total=env_returns, values=values)
        for term in guidance:
            returns = term.shape(seen, returns)

        # 4. the estimator's advantage per (episode, turn), spread over that turn's tokens
        adv_turn = advantage(returns, rl)  # [E, Tmax]
        adv_tokens = token_advantages(adv_turn.to(device), batch.owner.to(device), batch.turn.to(device), mask)

        # 5. loss terms: clipped surrogate (+ k3 KL to the SFT policy), + guidance terms (GTR-Turbo `sft`: CE on
        # the merged teacher's thoughts); PPO adds its value loss and takes ppo.epochs passes over the episodes.
        # Each pass is micro-batches whose losses are shares of the whole batch's and whose gradients add up.
        if rl.kl_beta > 0:
            with torch.no_grad(), reference(policy, ref, device, device != CPU) as frozen:
                logp_ref = torch.cat([token_logprobs(frozen, part) for part in parts])
        else:
            logp_ref = logp_old
        if ppo:
            _, targets = gae(returns.turn, values, valid, rl.ppo.gamma, rl.ppo.lam)  # [E, Tmax] V's targets
            if returns.after is not None:  # a term on the returns after estimation moves the targets too
                targets = targets + returns.after * valid
            targets, n_turns = targets.to(device), float(valid.sum())
            values_old = values.to(device)
        aggregation = "dr_grpo" if rl.algorithm == "dr_grpo" else "grpo"  # gtpo and ppo average as grpo does
        for k in range(epochs):
            loss, stats, v_loss = 0.0, {"kl": 0.0, "clip_fraction": 0.0}, 0.0
            for span, part in zip(spans, parts):
                rows = slice(span.start, span.stop)
                if not ppo:
                    logp, v_tok = token_logprobs(policy, part), None
                else:
                    logp, _, v_tok = scored_with_values(policy, head, part, temperature=ratio_t)
                if per_output:
                    share, part_stats = output_ratio_loss(logp, ratio_old[rows], out_weights[rows], cell[rows],
                                                          adv_turn.to(device).flatten(), clip_eps,
                                                          cells=float(valid.sum()))
                    part_stats["kl"] = torch.zeros(())
                else:
                    share, part_stats = policy_loss(logp, logp_old[rows], logp_ref[rows], adv_tokens[rows], mask[rows],
                                                    clip_eps=clip_eps,
                                                    kl_beta=rl.kl_beta, max_len=L_max, aggregation=aggregation,
                                                    rows=n_rows, tokens=n_tok)
                if ppo:
                    v_part, held = turn_values(v_tok, part, E, T, with_found=True)
                    v_share = value_loss(v_part, targets, valid.to(device) & held, turns=n_turns,
                                         old=values_old, clip=rl.ppo.value_clip)
                    v_loss += float(v_share.detach())
                    share = share + rl.ppo.value_coef * v_share
                if not torch.isfinite(share):
                    raise FloatingPointError(f"agent RL loss is {share.item()} at step {step}; last good checkpoint: "
                                             f"{saved[-1] if saved else 'none (the starting model)'}")
                updater.backward(share)
                loss += float(share.detach())
                for key in stats:
                    stats[key] += float(part_stats[key])
            for term in guidance if k == 0 else []:  # a guidance term's loss once per step
                for extra in term.loss(seen):
                    if not torch.isfinite(extra):
                        raise FloatingPointError(f"agent RL guidance loss is {extra.item()} at step {step}")
                    updater.backward(extra)
                    loss += float(extra.detach())
            if ppo:
                metrics["value_loss"] = v_loss
            metrics["grad_norm"] = updater.step()  # the last epoch's norm, before its clip
            with updater.gathered():
                for term in guidance:
                    term.after_epoch(policy, metrics)

        # 6. guidance terms follow the new weights (the merged teacher merges them in)
        with updater.gathered():
            for term in guidance:
                term.after_update(policy, metrics)
        seconds = time.perf_counter() - t0

        # 7. checkpoint and training state (rank 0 writes; the state save is collective)
        if due(step, rl.save_every, rl.steps):
            saved.append(checkpoint_dir(out_dir, step))
            with updater.gathered():
                if rank == 0:
                    save_student(policy, processor, saved[-1])
            run.save(step, {})
        metrics.update(rollout_metrics(eps))
        if on_log or world_size > 1:  # the step's figures over every rank's episodes (collective)
            n_tok = float(mask.sum())
            metrics.update({
                "entropy": float((entropy * mask).sum() / max(n_tok, 1.0)),
                "reward": float(returns.episode.mean()), "return": float(env_returns.mean()),  # after / before guidance
                "loss": loss, "kl_ref": stats["kl"], "micro_batches": float(len(parts)),
                "clip_fraction": stats["clip_fraction"], "rollout_s": rollout_s, "step_s": seconds,
                "lr": updater.optimizer.param_groups[0]["lr"],
                "tokens_per_episode": n_tok / len(eps)})
            metrics.update(thought_metrics(eps, batch, entropy.cpu(), processor))  # thought collapse
            if rl.eval_every and due(step, rl.eval_every, rl.steps):  # held-out curve: policy vs merged teacher
                metrics.update(held_out_point(policy, guidance, processor, cfg, image_size, device, updater.gathered))
            metrics = mean_over_ranks(metrics)
            if on_log:
                on_log(step, metrics)
        if stop_after is not None and step >= stop_after:
            break
    with updater.gathered():
        check_ranks_agree(policy, "agent RL")  # several processes: each rank's weights equal rank 0's
    if step >= rl.steps and rank == 0:
        for term in guidance:
            term.finish(out_dir, processor)
    barrier()
    return saved
