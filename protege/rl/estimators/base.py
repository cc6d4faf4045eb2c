"""What an advantage estimator reads and returns.

E episodes in groups of G consecutive rows (the G plays of one layout, or one question's G answers plus, for
RIL, its G teacher answers: a group of 2G). A single-turn answer is a one-turn episode (T = 1). Guidance terms
(GTR-Turbo's KL penalty, GTPO's similarity shaping) have already been added to the rewards, or, for a term
that acts after estimation (GTR-Turbo's KL as its code adds it), are in `after`.

Two words, one meaning each, here and in both loops: a *reward* is what one turn earns (the environment's or
the judge's, after guidance terms; a single-turn answer is one turn); a *return* is what is earned from a turn
to the end of its episode (GTPO and GAE discount it), and an episode's return, `[E]`, is the whole episode's:
the sum of its turn rewards unless a term credits it otherwise (`total`). A `Returns` holds a batch's rewards
and episode returns; the loops' and the hooks' variable `returns` is one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Returns:
    turn: torch.Tensor      # [E, T] per-turn rewards after guidance terms, 0 past the episode's last turn
    valid: torch.Tensor     # [E, T] bool, True on the episode's turns
    group_size: int         # G: rows per group
    total: torch.Tensor | None = None  # [E] each episode's credited return; None: the sum of its turn rewards
    values: torch.Tensor | None = None  # [E, T] the value head's V of each turn's state (PPO), else None
    # [E, T] added to each turn's return after the advantages are estimated: it moves that turn's advantage (and
    # PPO's value target) and no earlier turn's. GAE adds it before its batch normalisation, as GTR-Turbo's code
    # shifts the returns it then normalises; the group estimators after theirs.
    after: torch.Tensor | None = None

    @property
    def episode(self) -> torch.Tensor:
        """[E] what each episode is credited with."""
        return self.total if self.total is not None else (self.turn * self.valid).sum(1)

    @classmethod
    def single_turn(cls, rewards: torch.Tensor, group_size: int) -> "Returns":
        """One reward per answer ([E]) as one-turn episodes."""
        return cls(rewards.unsqueeze(1), torch.ones(len(rewards), 1, dtype=torch.bool), group_size, rewards)


# (returns, the loop's RL config section) -> [E, T] advantage per (episode, turn), 0 where not valid
Estimator = Callable[[Returns, Any], torch.Tensor]


def shifted(adv: torch.Tensor, r: Returns) -> torch.Tensor:
    """adv [E, T] plus the returns' `after` term on the valid turns."""
    if r.after is None:
        return adv
    return adv + torch.where(r.valid, r.after.to(adv.dtype), torch.zeros((), dtype=adv.dtype))


def on_every_turn(adv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """An episode-level advantage carried by each of the episode's turns. adv: [E]; valid: [E, T] -> [E, T]."""
    return torch.where(valid, adv.unsqueeze(1), torch.zeros((), dtype=adv.dtype))
