"""One RL step, shared by both loops, as its named phases:

    sample      prompts (questions or fresh layouts) and samples from pi_old, packed into micro-batches of rows
                of like length, each cut to its own longest row
    score_old   pi_old's log-probs, when a guidance term, a metric or the objective reads them before the update
    rewards     the judge or the environment, shaped by the guidance terms (RIL's discriminator, GTPO's shaping,
                GTR-Turbo's KL to the merged teacher), and with kl.placement reward the KL to pi_ref
    advantages  the estimator's advantage per (episode, turn), spread per answer or per turn's tokens
    update      the objective's passes over its mini-batches (the whole batch unless rl.mini_batches), one
                optimizer step each, guidance losses in the first; a non-finite loss stops the run naming the
                step and the last good checkpoint
    after       guidance terms follow the new weights; a rollout engine takes them
    evaluate    the learning curve's point, before the save (a resumed run never misses one), under fork_rng
    save        checkpoint and training state, every save_every steps
    log         the step's figures, averaged over the ranks

What differs between the loops lives in their rollout (rl/rollouts/); what differs between update rules in
their objective (rl/objectives/); what a run sets up once in its session (rl/session.py).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from protege.generation.row_seeds import row_seed
from protege.models.student import save_student
from protege.paths import checkpoint_dir
from protege.rl.estimators import Returns
from protege.rl.guidance.base import Guidance
from protege.rl.objectives.base import Old, UpdateBatch
from protege.rl.rollouts.base import Rollout
from protege.rl.sample import Sample
from protege.rl.session import Session
from protege.rollout.reference import reference
from protege.rollout.trajectory import length_parts, token_logprobs
from protege.runtime.distributed import (all_reduce_max, barrier, check_ranks_agree, mean_over_ranks, per_rank,
                                         rows_per_rank)
from protege.runtime.host_memory import release_free_host_memory
from protege.runtime.updaters import even_forwards
from protege.runtime.run import due


def train(s: Session, rollout: Rollout) -> list[Path]:
    """Runs the session's steps from where it resumed; returns the checkpoint folders written."""
    rollout.start(s)
    if s.start == 1:
        evaluate(s, rollout, 0)  # the curve's first point, before any update
    step = s.start - 1
    for step in range(s.start, s.cfg.steps + 1):
        rl_step(s, rollout, step)
        if s.stop_after is not None and step >= s.stop_after:
            break
    finish(s, rollout, finished=step >= s.cfg.steps)
    return s.saved


def rl_step(s: Session, rollout: Rollout, step: int) -> None:
    t0 = time.perf_counter()
    sample = rollout.sample(s, step)
    old = score_old(s, rollout, sample)
    ref = reference_logprobs(s, sample) if s.objective.kl_in_reward else None  # the KL placed in the reward
    returns = rewards(s, rollout, sample, old, ref)
    adv = rollout.spread(s, sample, s.advantage(returns, s.cfg))
    t_update = time.perf_counter()
    batch = UpdateBatch.of(sample, old, returns, adv, reference_logprobs(s, sample) if ref is None else ref, step)
    totals = update(s, batch, step)
    t_sync = time.perf_counter()
    rollout.after_update(s)
    seconds = time.perf_counter() - t0  # the step itself: the curve's evaluation and saves are not in it
    timing = {"rollout_s": sample.rollout_s, "update_s": t_sync - t_update, "sync_s": time.perf_counter() - t_sync,
              "step_s": seconds}
    curve = evaluate(s, rollout, step)
    save(s, step, rollout.cursor())
    if s.on_log is not None or s.world_size > 1:  # averaging over ranks is collective
        figures = {**sample.metrics, **rollout.metrics(s, sample, returns, adv, old, totals, seconds),
                   **update_figures(s, batch, totals), **timing, **curve}
        log(s, step, figures)


def rewards(s: Session, rollout: Rollout, sample: Sample, old: Old | None, ref: torch.Tensor | None) -> Returns:
    """The rollout's rewards shaped by the guidance terms; minus beta x KL to pi_ref when `ref` is given
    (`kl.placement: reward`, PPO-RLHF's placement: pi_ref is scored before the advantages, not after)."""
    returns = shape_rewards(s, rollout.rewards(s, sample, old), sample.view)
    return returns if ref is None else s.objective.kl_reward(sample, old, ref, returns)


def score_old(s: Session, rollout: Rollout, sample: Sample) -> Old | None:
    """pi_old = the policy that sampled, scored once (no gradient). None when nothing reads it before the update
    and the update takes one pass: its first forward's detached log-probs are pi_old's."""
    if not (rollout.reads_old or s.objective.needs_old):
        return None
    with torch.no_grad():
        return s.objective.score_old(s.policy, sample)


def shape_rewards(s: Session, returns: Returns, view) -> Returns:
    for term in s.guidance:  # in the order they are listed
        returns = term.shape(view, returns)
    return returns


def reference_logprobs(s: Session, sample: Sample) -> list[torch.Tensor | None]:
    """pi_ref's log-probs per micro-batch for the KL term (none without one: the forward would be wasted)."""
    if s.cfg.kl_beta <= 0:
        return [None] * len(sample.parts)
    with torch.no_grad(), reference(s.policy, s.ref, s.device, s.offload_ref) as frozen:
        return [token_logprobs(frozen, part) for part in sample.parts]


def update(s: Session, batch: UpdateBatch, step: int) -> dict[str, float]:
    """The objective's passes (ppo.epochs, rl.ppo_epochs; else one), each of its mini-batches (rl.mini_batches;
    else the whole batch) one optimizer step, each micro-batch's loss backpropagated as its share of the
    mini-batch's (across ranks) as it comes; the guidance terms' losses join the first step. Returns the last
    pass's sums: its figures of the whole batch, its loss the mean of its mini-batches' (with the guidance
    losses when it is the first)."""
    s.objective.prepare(batch)
    for epoch in range(s.objective.epochs):
        totals = dict.fromkeys(("loss", *s.objective.stats), 0.0)
        minis = mini_batches(s, batch, step, epoch)
        for m, mini in enumerate(minis):
            for i in range(len(mini.sample.parts)):
                share, stats = s.objective.loss(s.policy, i, mini)
                totals["loss"] += backward(s, share, step, "loss")
                for key, value in stats.items():
                    totals[key] += float(value)
            for term in s.guidance if epoch == 0 and m == 0 else []:
                for extra in term.loss(batch.sample.view):
                    totals["loss"] += backward(s, extra, step, "guidance loss")
            totals["grad_norm"] = s.updater.step()  # before its clip
        if len(minis) > 1:
            totals["loss"] /= len(minis)
        run_hooks(s, "after_epoch", batch.sample.metrics)
    run_hooks(s, "after_update", batch.sample.metrics)  # the merged teacher merges the new weights in
    return totals


def mini_batches(s: Session, batch: UpdateBatch, step: int, epoch: int) -> list[UpdateBatch]:
    """The step's batch as the objective's mini-batches for one pass: its rows shuffled (seeded by the run's
    seed, the step and the pass, so a resumed run shuffles alike) and dealt into that many, each regrouped by
    length into micro-batches. Each is normalised by its own rows and tokens (the loss of an optimizer step is
    its mini-batch's), its figures by the whole batch's tokens (the pass's figures are their sum). Every rank
    takes as many optimizer steps: with fewer rows than mini-batches on some rank, that many."""
    sample, n = batch.sample, batch.sample.batch.n
    k = min(s.objective.mini_batches, n)
    if k > 1 and s.world_size > 1:
        k = -int(all_reduce_max(torch.tensor(-k)))
    if k <= 1:
        return [batch]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(row_seed(s.seed, step, "mini_batches",
                                                                               epoch, s.rank)))
    ref = None if batch.logp_ref[0] is None else sample.whole(batch.logp_ref)
    out = []
    for chunk in torch.tensor_split(order, k):
        rows = sorted(chunk.tolist())
        parts, groups = length_parts(sample.batch.select(rows, s.processor), s.tokens_per_forward, s.processor,
                                     even_forwards(s.updater))
        mini = dataclasses.replace(sample, parts=[p.to(s.device) for p in parts],
                                   rows=[[rows[j] for j in g] for g in groups])
        tokens = float(sample.mask[rows].sum())
        out.append(dataclasses.replace(
            batch, sample=mini, rows=rows_per_rank(len(rows)), loss_tokens=per_rank(tokens),
            logp_ref=[None if ref is None else mini.take(i, ref) for i in range(len(parts))]))
    return out


def backward(s: Session, share: torch.Tensor, step: int, what: str) -> float:
    if not torch.isfinite(share):
        last = s.saved[-1] if s.saved else "none (the starting model)"
        raise FloatingPointError(f"{s.section} {what} is {share.item()} at step {step}; last good checkpoint: {last}")
    s.updater.backward(share)
    return float(share.detach())


def run_hooks(s: Session, hook: str, metrics: dict[str, float]) -> None:
    """A guidance hook on every term that has one, with the weights whole under ZeRO-3 (a collective gather,
    taken only when some term has the hook)."""
    terms = [t for t in s.guidance if getattr(type(t), hook) is not getattr(Guidance, hook)]
    if terms:
        with s.updater.gathered():
            for term in terms:
                getattr(term, hook)(s.policy, metrics)


def evaluate(s: Session, rollout: Rollout, step: int) -> dict[str, float]:
    """The curve's point on the weights after `step` updates. Greedy, and the RNG states are restored anyway:
    a run with the curve on ends with the same weights as one with it off."""
    if not rollout.curve_due(s, step):
        return {}
    with torch.random.fork_rng(devices=[] if s.device.type != "cuda" else None):
        return rollout.curve_point(s, step)


def save(s: Session, step: int, cursor: dict) -> None:
    """The training state (collective) every save_every steps and at the last; a checkpoint (rank 0 writes)
    every checkpoint_every of those saves and at the last."""
    if not due(step, s.cfg.save_every, s.cfg.steps):
        return
    release_free_host_memory()  # the update's freed temporaries, before the save's copies
    if due(step, s.cfg.save_every * s.cfg.checkpoint_every, s.cfg.steps):
        s.saved.append(checkpoint_dir(s.out_dir, step))
        with s.updater.gathered():
            if s.rank == 0:
                save_student(s.policy, s.processor, s.saved[-1])
    s.run.save(step, cursor)


def update_figures(s: Session, batch: UpdateBatch, totals: dict[str, float]) -> dict[str, float]:
    n_tok, old = max(batch.tokens, 1.0), batch.old
    figures = {"loss": totals["loss"], "kl": totals["kl"], "clip_fraction": totals["clip_fraction"],
               "entropy": (float((old.entropy * batch.sample.mask).sum() / n_tok) if old is not None
                           else totals["entropy_sum"] / n_tok),
               "micro_batches": float(len(batch.sample.parts)), "grad_norm": float(totals["grad_norm"]),
               "lr": s.updater.optimizer.param_groups[0]["lr"]}
    if "value_loss" in totals:
        figures["value_loss"] = totals["value_loss"]
    return {**figures, **padded_shares(batch.sample)}


def padded_shares(sample: Sample) -> dict[str, float]:
    """The share of padding among the tokens of the step's forwards (policy, pi_old, pi_ref alike): in its
    length groups, and had every row been padded to the batch's widest (one forward, or the split before
    length groups)."""
    real = float(sample.batch.inputs["attention_mask"].sum())
    return {"padded_share": 1 - real / sum(p.n * p.width for p in sample.parts),
            "padded_share_batch_wide": 1 - real / (sample.batch.n * sample.batch.width)}


def log(s: Session, step: int, figures: dict[str, float]) -> None:
    figures = mean_over_ranks(figures)  # each rank's share of the batch: the step's figures (collective)
    if s.on_log is not None:
        s.on_log(step, figures)


def finish(s: Session, rollout: Rollout, finished: bool) -> None:
    """Every rank's weights (and the objective's modules', PPO's value head) equal rank 0's; a finished run's
    guidance terms write what they keep."""
    rollout.close(s)
    with s.updater.gathered():
        check_ranks_agree(s.policy, s.section)
        for name, module in s.objective.modules().items():
            check_ranks_agree(module, f"{s.section} {name}")
    if finished and s.rank == 0:
        for term in s.guidance:
            term.finish(s.out_dir, s.processor)
    barrier()
