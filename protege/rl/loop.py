"""One RL loop for `grpo`, `dr_grpo` and `ril`.

Per step, per question: G student samples from pi_old; for `ril` also G cached teacher answers drawn
across teachers, mu_d discriminator updates on the 2G, reward = w_sim * similarity + w_answer * judge;
group-relative advantages; one clipped policy update with a k3 KL to pi_ref. Read top to bottom: this is
the whole algorithm. The advantages live in estimators/, RIL's discriminator reward in
guidance/discriminator.py, the losses in losses.py, the group layout in group.py.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from protege.config import RLConfig, result_params
from protege.data.rows import Row
from protege.errors import UserFacingError
from protege.generation.transformers_backend import Sampling, complete
from protege.models.processor import StudentProcessor
from protege.models.student import save_student
from protege.rewards.judge import rule_judge
from protege.paths import checkpoint_dir, checkpoints
from protege.rl.estimators import Returns, estimator
from protege.rollout.group import build_group
from protege.rl.guidance.base import Guidance, QuestionStep
from protege.rl.guidance.discriminator import DiscriminatorSimilarity
from protege.rl.policy_update import backward_policy_loss
from protege.rollout.reference import reference
from protege.rl.trainable import select_trainable
from protege.rollout.trajectory import from_completions, token_logprobs
from protege.runtime.distributed import barrier, check_ranks_agree, world
from protege.runtime.micro import budget_tokens, micro_batches
from protege.runtime.placement import CPU, resolve_device, to_device
from protege.runtime.run import Run, due, next_rows
from protege.runtime.state import OptimizerState, TorchRNG, Weights
from protege.runtime.state import fingerprint as state_fingerprint
from protege.runtime.updaters import make_updater


@dataclass
class RLInputs:
    rows: list[Row]
    teacher_answers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # question id -> (teacher, text)
    discriminator: torch.nn.Module | None = None
    judge: Callable[[list[str], list[str], list[str]], list[float]] | None = None  # None: the rule-based judge
    # the learning curve: called as evaluator(step, policy) at step 0, every rl.eval_every steps and at the last
    # step (rank 0 only); it must not sample: greedy decoding leaves the run's random generators untouched
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


def _teacher_draw(answers: list[tuple[str, str]], cfg: RLConfig, G: int, rng: random.Random) -> list[str]:
    pool = [text for teacher, text in answers if cfg.teachers == "both" or teacher == cfg.teachers]
    if not pool:
        return []
    return rng.sample(pool, G) if len(pool) >= G else [rng.choice(pool) for _ in range(G)]


def guidance_terms(cfg: RLConfig, inputs: RLInputs, processor: StudentProcessor,
                   device: torch.device) -> list[Guidance]:
    """The question loop's guidance terms, in the order they shape the rewards: RIL's discriminator similarity."""
    return [DiscriminatorSimilarity(inputs.discriminator, cfg, processor, device)] if cfg.algorithm == "ril" else []


def eval_due(step: int, cfg: RLConfig) -> bool:
    """Learning-curve points: step 0 (before any update), every eval_every steps, the last step."""
    return cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.steps)


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
                                    images_per_prompt=image_limit(policy, [r.image for r in rows]),
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
    rng = random.Random(seed)
    torch.manual_seed(seed)
    ril = cfg.algorithm == "ril"
    rank, world_size = world()
    if cfg.questions_per_step < world_size:
        raise UserFacingError(f"rl.questions_per_step ({cfg.questions_per_step}) must be at least the number of "
                              f"processes ({world_size})")
    device = resolve_device(cfg.device, "rl.device")
    advantage = estimator(cfg)
    if ril and inputs.discriminator is None:
        raise UserFacingError("rl.algorithm 'ril' needs a pretrained discriminator (run disc_pretrain first)")
    offload_ref = cfg.offload_idle
    policy.to(device)
    if ref is None and cfg.trainable != "lora" and cfg.kl_beta > 0:
        raise ValueError("run_rl: rl.kl_beta > 0 needs a reference model unless rl.trainable is lora")
    if ref is not None:
        ref.to(CPU if offload_ref else device)
    params = select_trainable(policy, cfg.trainable)
    updater = make_updater(cfg.backend, policy, params, cfg.lr, cfg.zero_stage, device)  # constant LR, as in RIL
    tokens_per_forward = budget_tokens(cfg.micro_batch_tokens, policy, device)
    guidance = guidance_terms(cfg, inputs, processor, device)
    # what exact resume brings back, by name (the file names of a state folder)
    parts = {"policy": Weights(updater), "optimizer": OptimizerState(updater), "rng": TorchRNG(device)}
    for term in guidance:
        parts.update(term.parts)
    if ref is not None:
        ref.eval().requires_grad_(False)
    sampling = Sampling(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                        repetition_penalty=cfg.repetition_penalty, max_new_tokens=cfg.max_new_tokens)
    tok = processor.tokenizer
    G = cfg.group_size
    with_teachers = ril and cfg.teacher_in_group
    longest_teacher = max((len(tok(t, add_special_tokens=False)["input_ids"]) + 1
                           for a in inputs.teacher_answers.values() for _, t in a), default=0)
    L_max = max(cfg.max_new_tokens, longest_teacher if with_teachers else 0)  # Dr.GRPO's constant denominator

    if ril:  # questions with no answer from the chosen teachers cannot form a RIL group
        usable = [r for r in inputs.rows if _teacher_draw(inputs.teacher_answers.get(r.id, []), cfg, 1, random.Random(0))]
        missing = len(inputs.rows) - len(usable)
        if missing and missing / len(inputs.rows) > cfg.max_missing_fraction:
            raise UserFacingError(f"{missing} of {len(inputs.rows)} questions have no cached answer from teachers="
                                  f"'{cfg.teachers}' (more than rl.max_missing_fraction={cfg.max_missing_fraction})")
        rows = usable
        skipped = missing
    else:
        rows, skipped = inputs.rows, 0
    if not rows:
        raise UserFacingError("no questions to train on")

    run = Run(state_dir, parts, rng, fingerprint(cfg, seed, inputs_digest), cfg.steps, rank=rank,
              world_size=world_size, barrier=barrier, on_saved=on_state_saved)
    start, cursor = run.resume()
    order: list[int] = cursor.get("order", [])
    saved = checkpoints(out_dir) if start > 1 else []
    for term in guidance if start > 1 else []:
        term.resumed()

    # who samples: the policy itself, or a vLLM engine started from its current (possibly resumed) weights
    rollout = _rollout_engine(cfg, policy, processor, updater, seed, rank, world_size, start, inputs.max_prompt_tokens,
                              rows)

    def after_update(step: int) -> None:  # the learning curve's hook, on the weights after `step` updates
        if inputs.evaluator is None or not eval_due(step, cfg):
            return
        # whole weights under ZeRO-3 (collective), one evaluating process; greedy, and the RNG states are
        # restored anyway, so a run with the curve on ends with the same weights as one with it off
        with updater.gathered(), torch.random.fork_rng(devices=[] if device.type != "cuda" else None):
            if rank == 0:
                inputs.evaluator(step, policy)

    if start == 1:
        after_update(0)
    step = start - 1
    for step in range(start, cfg.steps + 1):
        t0 = time.perf_counter()
        # 1. questions for this step (epoch-wise shuffle)
        idx, order = next_rows(order, len(rows), cfg.questions_per_step, rng)
        batch_rows = [rows[i] for i in idx]
        # every rank draws for the whole step (same RNG use everywhere), then keeps its share of questions
        teacher_texts = [_teacher_draw(inputs.teacher_answers.get(r.id, []), cfg, G, rng) if ril else []
                         for r in batch_rows]
        batch_rows, teacher_texts = batch_rows[rank::world_size], teacher_texts[rank::world_size]
        prompts = to_device(processor.encode_prompts([r.question for r in batch_rows], [r.image for r in batch_rows]),
                            device)

        # 2. G student samples per question from pi_old (= the current policy); G teacher answers for RIL
        t_rollout = time.perf_counter()
        with updater.gathered():
            student = complete(rollout, processor, prompts, [r.image for r in batch_rows], sampling, G,
                               questions=[r.question for r in batch_rows])
        rollout_s = time.perf_counter() - t_rollout
        if callable(getattr(rollout, "sleep", None)):
            rollout.sleep()  # a vLLM engine's memory goes to the update; taken back before the next rollout
        group, is_teacher, texts = build_group(student, prompts["input_ids"],
                                               teacher_texts if with_teachers else [[] for _ in batch_rows], processor, G)
        per_q = group.sequences.shape[0] // len(batch_rows)

        # 3. rewards: the judge's correctness; guidance terms shape them (RIL: mu_d discriminator updates on
        #    student (1) vs teacher (0) answers, then reward = w_sim * similarity + w_answer * judge)
        metrics: dict[str, float] = {}
        owners = [batch_rows[i // per_q] for i in range(len(texts))]
        if inputs.judge is None:
            answer = torch.tensor([rule_judge(r.answer, t, r.candidates) for r, t in zip(owners, texts)])
        else:
            answer = torch.tensor(inputs.judge([r.question for r in owners], [r.answer for r in owners], texts))
        returns = Returns.single_turn(answer, per_q)
        seen = QuestionStep(batch_rows, student.texts, teacher_texts, is_teacher, metrics, policy, device,
                            tokens_per_forward)
        for term in guidance:
            returns = term.shape(seen, returns)

        # 4. group-relative advantages (a group: a question's G answers, + its G teacher answers for RIL)
        adv = advantage(returns, cfg).flatten()  # [B]: one-turn episodes

        # 5. one policy update (mu = 1), in micro-batches whose gradients add up: pi_old equals pi_theta before
        #    this step, so each micro-batch's pi_old log-probs (student and teacher tokens alike) are its own
        #    detached ones and the ratio starts at exactly 1; the losses are shares of the whole group's
        traj = from_completions(group, processor.repeat_rows(prompts, [r.image for r in batch_rows], per_q), processor,
                                is_teacher, images=[r.image for r in batch_rows for _ in range(per_q)])
        mask = traj.loss_mask.float()  # [B, L] student and teacher answer tokens
        # the rollout engine's log-prob of each token it sampled (student rows), for its importance weights
        rollout_logp = sampled = None
        nonfinite = 0.0
        if student.logprobs is not None and cfg.rollout_correction == "tis":
            rollout_logp = torch.zeros(mask.shape)
            rollout_logp[~is_teacher, :student.logprobs.shape[1]] = student.logprobs.float().cpu()
            sampled = mask.cpu() * (~is_teacher).float().unsqueeze(1)
            if student.logprobs_finite is not None:  # a NaN / -inf engine log-prob: no importance weight there
                finite = torch.ones(mask.shape, dtype=torch.bool)
                finite[~is_teacher, :student.logprobs_finite.shape[1]] = student.logprobs_finite.cpu()
                nonfinite = float((sampled * (~finite).float()).sum())
                sampled = sampled * finite.float()
        parts = [traj.select(rows_, processor) if len(rows_) < traj.n else traj
                 for rows_ in micro_batches(traj.n, traj.width, tokens_per_forward)]
        seen.batch, seen.parts = traj, parts
        logp_ref = [None] * len(parts)
        if cfg.kl_beta > 0:  # with no KL term the reference forward would be wasted
            with torch.no_grad(), reference(policy, ref, device, offload_ref) as ref_model:
                logp_ref = [token_logprobs(ref_model, part) for part in parts]
        n_tok = float(mask.sum())
        t_update = time.perf_counter()
        totals = backward_policy_loss(policy, updater, traj, parts, logp_ref, adv, cfg, L_max, device,
                                      rollout_logp=rollout_logp, sampled=sampled,
                                      where=f" at step {step}; last good checkpoint: "
                                            f"{saved[-1] if saved else 'none (the SFT model)'}")
        loss = totals["loss"]
        for term in guidance:  # guidance terms' losses, as micro-batch shares
            for extra in term.loss(seen):
                if not torch.isfinite(extra):
                    raise FloatingPointError(f"RL guidance loss is {extra.item()} at step {step}")
                updater.backward(extra)
                loss += float(extra.detach())
        updater.step()  # the update's one optimizer step (mu = 1): guidance terms follow the new weights
        if guidance:
            with updater.gathered():  # whole weights under ZeRO-3 (collective)
                for term in guidance:
                    term.after_epoch(policy, metrics)
                for term in guidance:
                    term.after_update(policy, metrics)
        update_s = time.perf_counter() - t_update
        if rollout is not policy:  # the engine samples the next step: it wakes and gets the updated weights now
            with updater.gathered():
                rollout.sync_weights(policy)
        sync_s = time.perf_counter() - t_update - update_s
        seconds = time.perf_counter() - t0  # the step itself: the curve's evaluation and saves are not in it
        after_update(step)  # before the state save: a resumed run never misses a point

        if due(step, cfg.save_every, cfg.steps):
            saved.append(checkpoint_dir(out_dir, step))
            with updater.gathered():
                if rank == 0:
                    save_student(policy, processor, saved[-1])
            run.save(step, {"order": order})  # collective under DeepSpeed
        if on_log:
            mask = mask.cpu()
            s_rows, t_rows = ~traj.is_teacher, traj.is_teacher  # [B] student rows, teacher rows
            metrics.update({
                "reward": returns.episode[s_rows].mean().item(), "answer_reward_student": answer[s_rows].mean().item(),
                "loss": loss, "kl": totals["kl"], "clip_fraction": totals["clip_fraction"],
                "entropy": totals["entropy_sum"] / max(n_tok, 1.0), "micro_batches": float(len(parts)),
                "response_length": float(mask[s_rows].sum() / max(int(s_rows.sum()), 1)),
                "advantage_mean": adv.mean().item(), "advantage_std": adv.std().item(),
                "samples_per_s": mask.shape[0] / seconds, "tokens_per_s": n_tok / seconds,
                "rollout_tokens_per_s": float(student.completion_mask.sum()) / rollout_s, "update_s": update_s,
                "sync_s": sync_s,
                "skipped_questions": float(skipped)})
            if t_rows.any():
                metrics["answer_reward_teacher"] = answer[t_rows].mean().item()
            if rollout_logp is not None:  # how far the engine's distribution is from the policy's
                n_sampled = max(float(sampled.sum()), 1.0)
                metrics.update(tis_weight_mean=totals["is_sum"] / n_sampled,
                               tis_capped_fraction=totals["is_capped"] / n_sampled,
                               rollout_logp_gap=totals["lp_gap"] / n_sampled, rollout_logp_nonfinite=nonfinite)
            on_log(step, metrics)
        if stop_after is not None and step >= stop_after:
            break
    if rollout is not policy:
        rollout.close()
    with updater.gathered():
        check_ranks_agree(policy, "rl")  # several processes: each rank's weights equal rank 0's
    if step >= cfg.steps and rank == 0:
        for term in guidance:
            term.finish(out_dir, processor)
    barrier()
    return saved
