"""Policy-gradient losses as pure tensor functions (one variant, one function).

N = sequences in the batch, L = completion positions (padded). `mask` [N, L] is 1 on completion tokens.
"""
from __future__ import annotations

import torch


def clipped_surrogate(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                      clip_eps: float, clip_eps_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss -min(r A, clip(r, 1-eps, 1+eps_high) A), r = exp(logp - logp_old); eps_high
    None: eps (DAPO's clip-higher sets it above eps, so a rare token's ratio may grow further).

    logp, logp_old: [N, L]; advantages: [N] (one per sequence) or [N, L] (per token, e.g. per turn)
    -> (loss [N, L], clipped [N, L] bool: the clip was active).
    """
    ratio = torch.exp(logp - logp_old)  # [N, L]
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(1)  # [N, L] or [N, 1]
    unclipped = ratio * adv
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


# Estimators of KL(pi_theta || pi_ref) per sampled token, from the two log-probs of the token (Schulman's
# "Approximating KL divergence"): [N, L] -> [N, L]. Sampled from pi_theta, k1 is unbiased but often negative,
# k2 is biased and low-variance, k3 unbiased and never negative.
def kl_k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """log pi - log pi_ref."""
    return logp - logp_ref


def kl_k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """(log pi - log pi_ref)^2 / 2."""
    return 0.5 * (logp - logp_ref) ** 2


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref): exp(d) - d - 1, d = logp_ref - logp. [N, L] -> [N, L]."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1


def kl_low_var(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """verl's low_var_kl: k3 with d clamped to [-20, 20] before the exp and the result to [-10, 10], so one token
    the reference finds far likelier cannot blow the term (or its gradient) up."""
    d = torch.clamp(logp_ref - logp, min=-20, max=20)
    return torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var": kl_low_var}


# How the per-token loss becomes one number (verl's loss_agg_mode names). Each takes the whole batch's
# normalisers, so a micro-batch's value is its share and the micro-batches' values add up to the batch's.
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo")


def aggregate_dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, max_len: int, rows: int | None = None) -> torch.Tensor:
    """Dr.GRPO: sum over every completion token of the batch / (N * L_max). [N, L] -> scalar.

    A constant denominator removes GRPO's length bias. For a micro-batch, `rows` is the whole batch's N: the
    micro-batches' values then add up to the whole batch's.
    """
    return (per_token * mask).sum() / ((rows or per_token.shape[0]) * max_len)


def aggregate_grpo(per_token: torch.Tensor, mask: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """GRPO (seq_mean_token_mean): mean over sequences of each sequence's token mean. [N, L] -> scalar (with
    `rows`, the whole batch's N: this micro-batch's share of that mean)."""
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [N]
    return per_seq.sum() / (rows or per_seq.shape[0])


def aggregate_seq_sum(per_token: torch.Tensor, mask: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """seq_mean_token_sum: mean over sequences of each sequence's token sum. [N, L] -> scalar."""
    return (per_token * mask).sum(dim=1).sum() / (rows or per_token.shape[0])


def aggregate_token_mean(per_token: torch.Tensor, mask: torch.Tensor, tokens: float | None = None) -> torch.Tensor:
    """token_mean (DAPO's token-level loss): sum over every scored token / their number, so a long answer
    weighs by its tokens. [N, L] -> scalar; `tokens`: the whole batch's count (this micro-batch's share)."""
    return (per_token * mask).sum() / (mask.sum().clamp(min=1) if tokens is None else max(float(tokens), 1.0))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, *, max_len: int, rows: int | None = None,
              tokens: float | None = None) -> torch.Tensor:
    """`per_token` [N, L] aggregated the way `how` (one of AGGREGATIONS) names -> scalar."""
    if how == "dr_grpo":
        return aggregate_dr_grpo(per_token, mask, max_len, rows)
    if how == "seq_mean_token_mean":
        return aggregate_grpo(per_token, mask, rows)
    if how == "seq_mean_token_sum":
        return aggregate_seq_sum(per_token, mask, rows)
    if how == "token_mean":
        return aggregate_token_mean(per_token, mask, tokens)
    raise ValueError(f"unknown aggregation {how!r}; expected one of {', '.join(AGGREGATIONS)}")


def policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, *, clip_eps: float, kl_beta: float, aggregation: str,
                max_len: int, rows: int | None = None, tokens: float | None = None,
                is_weights: torch.Tensor | None = None, clip_eps_high: float | None = None,
                kl_estimator: str = "k3", loss_tokens: float | None = None, entropy: torch.Tensor | None = None,
                entropy_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + beta * KL (`kl_estimator`) - entropy_coef * entropy, aggregated per `aggregation`.

    logp, logp_old, logp_ref, mask: [N, L]; advantages: [N] or [N, L] -> (scalar loss, detached stats).
    `is_weights` [N, L] (detached) multiply the surrogate per token: the rollout engine's correction
    (`rollout_is_weights`), 1 where the tokens were not sampled by another engine. `entropy` [N, L]: the
    policy's entropy at each token, with its graph, for the bonus (aggregated as the rest of the loss, as verl
    does). For a micro-batch of a larger batch, `rows` and `loss_tokens` are the whole batch's sequences and
    scored tokens (over the ranks) the loss is normalised by, `tokens` this rank's scored tokens the stats
    are: the loss and the stats are then this micro-batch's shares, which add up to the whole batch's.
    """
    surrogate, clipped = clipped_surrogate(logp, logp_old, advantages, clip_eps, clip_eps_high)
    if is_weights is not None:
        surrogate = surrogate * is_weights
    kl = KL_ESTIMATORS[kl_estimator](logp, logp_ref)
    per_token = surrogate + kl_beta * kl  # [N, L]
    if entropy is not None and entropy_coef:
        per_token = per_token - entropy_coef * entropy
    n_tok = mask.sum().clamp(min=1) if tokens is None else max(float(tokens), 1.0)
    loss = aggregate(per_token, mask, aggregation, max_len=max_len, rows=rows,
                     tokens=loss_tokens if loss_tokens is not None else tokens)
    stats = {"kl": ((kl * mask).sum() / n_tok).detach(),
             "clip_fraction": ((clipped.float() * mask).sum() / n_tok).detach()}
    return loss, stats


def turn_sums(per_token: torch.Tensor, mask: torch.Tensor, owner: torch.Tensor, turn: torch.Tensor, episodes: int,
              turns: int) -> torch.Tensor:
    """The masked per-token values summed per (episode, turn): per_token, mask, turn [N, L], owner [N] (each
    row's episode) -> [episodes, turns]. PPO-RLHF's KL in the reward: each turn's reward pays beta times the
    summed KL of its tokens."""
    keep = mask.bool() & (turn >= 0)
    cell = (owner.unsqueeze(1) * turns + turn.clamp(min=0))[keep]
    out = torch.zeros(episodes * turns, dtype=per_token.dtype, device=per_token.device)
    return out.index_add_(0, cell, per_token[keep]).view(episodes, turns)


def overlong_penalty(lengths: torch.Tensor, max_len: int, window: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. 13), added to each answer's reward: 0 up to max_len - window tokens,
    then falling linearly to -penalty at max_len, -penalty beyond. lengths: [N] answer tokens -> [N] float."""
    start = max_len - window
    over = (lengths.float() - start).clamp(min=0)
    return -penalty * torch.clamp(over / window, max=1.0)


def rollout_is_weights(logp_old: torch.Tensor, logp_rollout: torch.Tensor, sampled: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """Truncated importance sampling for tokens a rollout engine sampled (vLLM in bf16) while the policy scores
    them in its own precision: w = min(pi_old / pi_rollout, cap) per token, 1 where `sampled` is 0 (a teacher's
    tokens, padding). logp_old, logp_rollout: [N, L]; sampled: [N, L] -> [N, L], detached."""
    w = torch.exp(logp_old.detach() - logp_rollout).clamp(max=cap)
    return torch.where(sampled.bool(), w, torch.ones_like(w)).detach()


def output_ratio_loss(logp: torch.Tensor, logp_old: torch.Tensor, weights: torch.Tensor, cell: torch.Tensor,
                      advantages: torch.Tensor, clip_eps: float,
                      cells: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RL4VLM's PPO objective (GTR-Turbo's code): one ratio per output (a policy turn),
    r = exp(sum_t w_t (log pi_t - log pi_old_t)) with w = thought_weight on the thought's tokens and 1 on the
    rest of the turn's, and -min(r A, clip(r, 1-eps, 1+eps) A) per output, averaged over outputs.

    logp, logp_old, weights: [N, L] (weights 0 off the policy's tokens); cell: [N, L] each token's flat
    (episode, turn) index, -1 off the policy's tokens; advantages: [C] per flat cell -> (scalar loss, detached
    stats). For a micro-batch, `cells` is the whole batch's count of outputs: the loss is then its share.
    """
    on = cell >= 0
    C = advantages.shape[0]
    idx = cell[on]
    seq = torch.zeros(C, dtype=logp.dtype, device=logp.device).index_add(0, idx, (weights * logp)[on])
    seq_old = torch.zeros(C, dtype=logp.dtype, device=logp.device).index_add(0, idx, (weights * logp_old)[on])
    present = torch.zeros(C, dtype=torch.bool, device=logp.device)
    present[idx] = True
    ratio = torch.exp(seq[present] - seq_old[present])  # [C'] the outputs this batch holds
    adv = advantages[present]
    unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_output = -torch.minimum(unclipped, clipped)
    n = float(present.sum()) if cells is None else max(float(cells), 1.0)
    return per_output.sum() / n, {"clip_fraction": ((clipped < unclipped).float().sum() / n).detach()}


def merged_kl_penalty(logp: torch.Tensor, logp_merged: torch.Tensor, thought: torch.Tensor, turn: torch.Tensor,
                      owner: torch.Tensor, episodes: int, turns: int, clamp_max: float = 10.0) -> torch.Tensor:
    """GTR-Turbo's KL guidance, per (episode, turn): the mean over that turn's thought tokens of
    clamp(log pi - log pi_M, 0, max), to be subtracted (times a coefficient) from that turn's reward.

    logp, logp_merged: [N, L] log-probs of the policy's sampled tokens under the policy and the merged teacher;
    thought: [N, L] 1 on the thought tokens of the policy's turns (the action excluded); turn: [N, L] each
    target token's turn; owner: [N] the episode of each row -> [episodes, turns], 0 where a turn has no
    thought token. The clamp keeps the penalty one-sided and bounded: tokens the teacher likes more cost
    nothing.
    """
    d = torch.clamp(logp - logp_merged, min=0.0, max=clamp_max)  # [N, L]
    keep = thought.bool() & (turn >= 0)  # [N, L]
    cell = (owner.unsqueeze(1) * turns + turn.clamp(min=0))[keep]  # [K] flat (episode, turn) of each kept token
    sums = torch.zeros(episodes * turns, dtype=d.dtype, device=d.device).index_add_(0, cell, d[keep])
    counts = torch.zeros(episodes * turns, dtype=d.dtype, device=d.device).index_add_(0, cell, torch.ones_like(d[keep]))
    return (sums / counts.clamp(min=1)).view(episodes, turns)


def unparsed_kl(penalty: torch.Tensor, well_formed: torch.Tensor, unparsed: float | None) -> torch.Tensor:
    """GTR-Turbo's KL for a turn whose output does not split into a thought and an action: there is no thought
    to compare with the teacher's, and the code charges a fixed `unparsed` (100, ten times its clamp) instead.

    penalty: [E, T] merged_kl_penalty; well_formed: [E, T] bool -> [E, T]; `unparsed` None: the clamped KL
    over all the turn's tokens stands (merged_kl_penalty read them all as thought)."""
    if unparsed is None:
        return penalty
    return torch.where(well_formed, penalty, torch.full_like(penalty, unparsed))


def format_bonus(well_formed: torch.Tensor, valid: torch.Tensor, ok: float, bad: float) -> torch.Tensor:
    """GTR-Turbo's format reward, per (episode, turn): `ok` for a turn whose output splits into a thought and
    an action, `bad` for one that does not (the code: +3 and -2), added to that turn's return.

    well_formed, valid: [E, T] bool (valid: the episode's turns) -> [E, T] float, 0 past an episode's end."""
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(valid, torch.where(well_formed, torch.tensor(ok), torch.tensor(bad)), zero)
