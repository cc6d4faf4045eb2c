"""GTPO (Group Turn Policy Optimization, arXiv 2511.14846): turn-level credit for multi-turn tool use.

An episode is a sequence of turns, each with its own reward (a format or tool-error penalty on the turn
where it happens, correctness on the last turn). Instead of one advantage per episode (GRPO,
`protege.rl.advantages.group_advantages`), each turn gets the normalised discounted reward-to-go, and a
failed episode is shaped towards the code of the successful episodes of its group.

Notation: E episodes in the batch, laid out as consecutive groups of G (G rollouts of one question);
Tmax the most turns of any episode. Per-turn tensors are padded to [E, Tmax] and come with
`valid` [E, Tmax] bool, True on the turns the episode really has. Turn j of episode i is valid iff
j < n_i, so `valid` is a left-aligned prefix, though nothing below needs that.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

STD_EPS = 1e-4
SCOPES = ("group", "batch", "turn")


def _check_gamma(gamma: float) -> None:
    if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):  # also rejects NaN
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")


def _check_group_size(n: int, group_size: int) -> None:
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if n % group_size:
        raise ValueError(f"{n} episodes do not split into groups of {group_size} (group_size must divide E)")


def discounted_returns(rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reward-to-go per turn: R_ij = sum_{m >= j, m valid} gamma^(m-j) r_im; 0 on invalid turns.

    rewards: [E, Tmax] float; valid: [E, Tmax] bool -> returns [E, Tmax] (rewards' dtype).
    gamma = 0 gives each turn its own reward, gamma = 1 the undiscounted rest of the episode. The backward
    recursion R_j = r_j + gamma R_{j+1} is exact for gamma = 0 (no 0^0 to get wrong) and costs Tmax steps,
    which is a handful of turns.
    """
    _check_gamma(gamma)
    valid = valid.bool()
    r = torch.where(valid, rewards, torch.zeros_like(rewards))  # [E, Tmax]; padding must not leak backwards
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])  # [E]
    for j in range(r.shape[1] - 1, -1, -1):
        running = r[:, j] + gamma * running
        out[:, j] = running
    return torch.where(valid, out, torch.zeros_like(out))


def turn_advantages(returns: torch.Tensor, valid: torch.Tensor, group_size: int, scope: str,
                    eps: float = STD_EPS, *, scale_by_std: bool = True) -> torch.Tensor:
    """A_ij = (R_ij - mean) / (std + eps) over a pool of valid (episode, turn) returns; 0 on invalid turns.

    returns: [E, Tmax]; valid: [E, Tmax] bool -> advantages [E, Tmax].
    scope "group": the pool is every valid turn of the G episodes of the same question (E must be a
    multiple of `group_size`); "batch": every valid turn in the batch (`group_size` is then only checked).
    std is the unbiased sample std, as in `group_advantages`. A pool with a single entry has no std:
    that entry is its own mean, so its advantage is 0 (centred, then divided by eps). scale_by_std=False
    keeps only the centring (Dr.GRPO-style), which does not up-weight pools whose returns barely differ.

    On the scope, the sources disagree. As we read it (from memory, not re-checked against the PDF), the
    paper's text normalises a turn's return against the returns of the same group of rollouts of one
    question (GRPO's group, extended over turns): our "group". Public re-implementations of turn-level
    GRPO variants often normalise over the whole batch instead (a global mean/std, as REINFORCE++-style
    estimators do): our "batch". "batch" has lower variance with a small G, but it lets easy and hard
    questions shift each other's baselines. We have not settled which one the authors' code uses, so both
    are configurable and "group" is the project's default. A third reading, "turn", normalises across the
    group's returns at the same turn index j only. Pooling turns ("group", "batch") has a side effect we
    measured: with gamma < 1 an early turn's return is below a later one's even when every episode of the
    group succeeds, so a group of equal successes still pushes its first turns down; "turn" gives such a
    group zero advantage everywhere, as GRPO would. Late turn indices reached by one episode get 0.
    """
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; expected one of {SCOPES}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    E, T = returns.shape
    _check_group_size(E, group_size)
    v = valid.bool()
    if scope == "turn":  # pools: (group, turn index); move the turn index next to the group index
        G = group_size
        R = returns.reshape(E // G, G, T).transpose(1, 2).reshape(E // G * T, G)  # [P*T, G]
        m = v.reshape(E // G, G, T).transpose(1, 2).reshape(E // G * T, G)  # [P*T, G]
        A = _normalise(R, m.to(returns.dtype), eps, scale_by_std)  # [P*T, G]
        return A.reshape(E // G, T, G).transpose(1, 2).reshape(E, T)
    per_pool = group_size if scope == "group" else E
    R = returns.reshape(E // per_pool, per_pool * T)  # [P, G*Tmax] (P pools)
    m = v.reshape(E // per_pool, per_pool * T).to(returns.dtype)  # [P, G*Tmax]
    return _normalise(R, m, eps, scale_by_std).reshape(E, T)


def _normalise(R: torch.Tensor, m: torch.Tensor, eps: float, scale_by_std: bool) -> torch.Tensor:
    """Row-wise (R - mean) / (std + eps) over the entries where m is 1; 0 elsewhere. R, m: [P, K] -> [P, K]."""
    n = m.sum(dim=1, keepdim=True)  # [P, 1] valid entries per pool
    mean = (R * m).sum(dim=1, keepdim=True) / n.clamp(min=1)  # [P, 1]
    centred = (R - mean) * m  # [P, K]
    if scale_by_std:
        var = (centred ** 2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)  # [P, 1]; n <= 1: centred is 0
        centred = centred / (var.sqrt() + eps)
    return centred


def token_advantages(adv: torch.Tensor, owner: torch.Tensor, turn: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Spread per-turn advantages over a packed training batch: each policy token gets its turn's A.

    adv: [E, Tmax] per (episode, turn); owner: [N] long, the episode of each row; turn: [N, T-1] long, the
    turn of each target token, -1 on padding; mask: [N, T-1], nonzero on the policy's own tokens
    -> [N, T-1] (adv's dtype), 0 off the mask. A row may hold a whole episode (turn steps 0, 1, 2, ...)
    or one turn (turn constant along the row); the lookup is the same. Observation and tool-output
    tokens carry their turn index too, and only the mask keeps them out of the loss.
    """
    on = mask.bool()  # [N, T-1]
    if bool((on & (turn < 0)).any()):
        raise ValueError("a policy token (mask 1) has turn -1: the turn index and the loss mask disagree")
    if bool((on & (turn >= adv.shape[1])).any()):
        raise ValueError(f"a policy token's turn index is >= Tmax = {adv.shape[1]} of the advantages")
    rows = owner.long().unsqueeze(1).expand_as(turn)  # [N, T-1]
    picked = adv[rows, turn.long().clamp(0, adv.shape[1] - 1)]  # [N, T-1]; padding reads a dummy, zeroed next
    return torch.where(on, picked, torch.zeros_like(picked))


def similarity_shaping(codes: Sequence[str], success: Sequence[bool] | torch.Tensor, group_size: int,
                       alpha: float, embed: Callable[[list[str]], torch.Tensor]) -> torch.Tensor:
    """Bonus for failed episodes: alpha * mean over the group's successful episodes k of cos(e_i, e_k).

    codes: E strings, each an episode's code blocks joined by "\\n" ("" when it wrote none);
    success: E bools (list or [E] tensor); embed: list of n texts -> [n, D] (normalised here, so any
    scale works) -> bonus [E] float32 on the CPU.
    The bonus is 0 for a successful episode, for a failed one that wrote no code (nothing to compare),
    and in a group without a successful episode (no reference, as the paper has it). A successful
    episode that wrote no code is no reference either: it is left out of the mean rather than counted as
    cosine 0, so a direct answer in the group does not dilute the others' pull. The cosine can be
    negative with a sentence model; the bonus then is too, which is the paper's formula as written.
    Only the texts that take part are embedded, and embed is not called at all when none do.
    """
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    E = len(codes)
    ok = [bool(s) for s in (success.tolist() if isinstance(success, torch.Tensor) else success)]
    if len(ok) != E:
        raise ValueError(f"success has {len(ok)} entries for {E} episodes")
    _check_group_size(E, group_size)
    has_code = [bool(c.strip()) for c in codes]
    bonus = torch.zeros(E, dtype=torch.float32)
    pairs: list[tuple[int, list[int]]] = []  # (failed episode, its group's successful episodes with code)
    for g in range(0, E, group_size):
        refs = [k for k in range(g, g + group_size) if ok[k] and has_code[k]]
        if refs:
            pairs += [(i, refs) for i in range(g, g + group_size) if not ok[i] and has_code[i]]
    if alpha == 0 or not pairs:
        return bonus
    needed = sorted({i for i, _ in pairs} | {k for _, refs in pairs for k in refs})
    row = {ep: r for r, ep in enumerate(needed)}
    e = embed([codes[i] for i in needed]).detach().float().cpu()  # [n, D]
    if e.dim() != 2 or e.shape[0] != len(needed):
        raise ValueError(f"embed returned shape {tuple(e.shape)} for {len(needed)} texts; expected [n, D]")
    e = e / e.norm(dim=1, keepdim=True).clamp(min=1e-12)  # [n, D]; a zero vector stays zero (cosine 0)
    for i, refs in pairs:
        cos = e[[row[k] for k in refs]] @ e[row[i]]  # [|P|]
        bonus[i] = alpha * cos.mean()
    return bonus


def add_final_turn_bonus(rewards: torch.Tensor, valid: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """rewards with bonus[i] added on episode i's last valid turn, before the returns are computed.

    rewards: [E, Tmax]; valid: [E, Tmax] bool; bonus: [E] -> new [E, Tmax] (inputs untouched).
    The last turn is where correctness lands, so the shaping discounts back through the episode like it.
    An episode without turns cannot take a nonzero bonus.
    """
    v = valid.bool()
    idx = torch.arange(v.shape[1], device=v.device).expand_as(v)  # [E, Tmax]
    last = torch.where(v, idx, torch.full_like(idx, -1)).max(dim=1).values  # [E]; -1: no valid turn
    b = bonus.to(device=rewards.device, dtype=rewards.dtype)
    if bool(((last < 0) & (b != 0)).any()):
        raise ValueError("a nonzero bonus for an episode with no valid turn")
    out = rewards.clone()
    has = last >= 0
    rows = torch.arange(v.shape[0], device=v.device)[has]
    out[rows, last[has]] += b[has]
    return out
