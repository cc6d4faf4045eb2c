"""PPO's pieces for the multi-turn loop (GTR-Turbo's base, as RL4VLM): a value head on the policy's last hidden
state, generalized advantage estimation over turns, and the value loss. Pure tensor functions plus one module.

A turn is one PPO step: its state is the context before the turn's first policy token, its reward the
environment's reward for the turn (after guidance terms), and the episode ends after its last turn.
"""
from __future__ import annotations

import torch

from protege.rollout.trajectory import Trajectory, score


class ValueHead(torch.nn.Module):
    """V(s) = w . h + b on the policy's last hidden state h; starts at V = 0 (zero weights), as the
    returns' scale is unknown before the first update."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)  # [..., H] -> [...]


def scored_with_values(model, head: ValueHead, traj: Trajectory, temperature: float = 1.0):
    """One forward: log pi of every scored target token [N, L] (at `temperature`), the entropy there [N, L], and
    the value of the state each target token is written from [N, L] (position t's hidden state predicts t + 1)."""
    s = score(model, traj, with_entropy=True, with_hidden=True, temperature=temperature)
    return s.logp, s.entropy, head(s.hidden)  # [N, L] each


def turn_values(values: torch.Tensor, traj: Trajectory, episodes: int, turns: int,
                with_found: bool = False):
    """V of each (episode, turn): the value at the turn's first policy token. values: [N, L] -> [E, T], 0 for
    a turn the episode does not have (or, for a micro-batch, whose row is elsewhere); with `with_found` also
    [E, T] bool, True where the turn's first token is in `traj`."""
    own = traj.loss_mask.bool()  # [N, L]
    N, L = own.shape
    cell = traj.owner.unsqueeze(1) * turns + traj.turn.clamp(min=0)  # [N, L] flat (episode, turn)
    pos = torch.arange(N * L, device=values.device).view(N, L)  # flat index of each token
    first = torch.full((episodes * turns,), N * L, dtype=torch.long, device=values.device)
    first = first.scatter_reduce(0, cell[own], pos[own], reduce="amin")  # [E * T] first token of each turn
    found = first < N * L
    out = torch.zeros(episodes * turns, dtype=values.dtype, device=values.device)
    out[found] = values.flatten()[first[found]]
    return (out.view(episodes, turns), found.view(episodes, turns)) if with_found else out.view(episodes, turns)


def gae(rewards: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over each episode's turns, the episode ending after its last turn.

    rewards, values: [E, T]; valid: [E, T] bool (a left-aligned prefix per episode) -> (advantages [E, T],
    value targets A + V [E, T]), 0 on turns an episode does not have.
    delta_j = r_j + gamma V_{j+1} - V_j (V_{j+1} = 0 after the last turn); A_j = delta_j + gamma lam A_{j+1}.
    """
    v = valid.to(rewards.dtype)
    E, T = rewards.shape
    adv = torch.zeros_like(rewards)
    next_v = torch.zeros(E, dtype=rewards.dtype, device=rewards.device)
    next_a = torch.zeros(E, dtype=rewards.dtype, device=rewards.device)
    for j in range(T - 1, -1, -1):
        delta = rewards[:, j] + gamma * next_v - values[:, j]
        a = (delta + gamma * lam * next_a) * v[:, j]
        adv[:, j] = a
        next_v, next_a = values[:, j] * v[:, j], a
    return adv, (adv + values) * v


def value_loss(values: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor,
               turns: float | None = None, old: torch.Tensor | None = None, clip: float | None = None) -> torch.Tensor:
    """0.5 * mean over the valid turns of (V - target)^2. values, targets: [E, T]; valid: [E, T] -> scalar.
    For a micro-batch, `valid` marks the turns it holds and `turns` counts the whole batch's valid turns: the
    value is then this micro-batch's share of the whole batch's loss.
    With `old` (V when the episodes were played, [E, T]) and `clip`, each turn's term is RL4VLM's clipped one,
    max((V - target)^2, (old + clamp(V - old, -clip, clip) - target)^2): V gains nothing from moving more than
    `clip` from `old` in one update, which keeps the value loss of large returns off a backbone the policy shares."""
    v = valid.to(values.dtype)
    err = (values - targets) ** 2
    if old is not None and clip is not None:
        old = old.to(values.dtype)
        err = torch.maximum(err, (old + (values - old).clamp(-clip, clip) - targets) ** 2)
    return 0.5 * (err * v).sum() / (v.sum().clamp(min=1) if turns is None else max(turns, 1.0))
