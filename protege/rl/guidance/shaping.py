"""GTPO's reward shaping: a failed episode's last turn gains alpha times its code's mean similarity to the
code of its group's successful episodes; the episode is then credited with the sum of its turn rewards."""
from __future__ import annotations

from dataclasses import replace

import torch

from protege.rl.code_similarity import make_embedder
from protege.rollout.episodes import Episode
from protege.rl.estimators.base import Returns
from protege.rl.gtpo import add_final_turn_bonus, similarity_shaping
from protege.rl.guidance.base import Guidance, Step


def episode_code(ep: Episode) -> str:
    """Every code block the episode ran, in order (GTPO compares failed episodes' code to successful ones')."""
    return "\n".join(i["code"] for i in ep.infos if i.get("code"))


class SimilarityShaping(Guidance):
    def __init__(self, alpha: float, embedder: str | None):
        self.alpha = alpha
        self.embed = make_embedder(embedder) if alpha > 0 else None

    def shape(self, step: Step, returns: Returns) -> Returns:
        eps = step.episodes
        bonus = (similarity_shaping([episode_code(e) for e in eps], [e.success for e in eps], returns.group_size,
                                    self.alpha, self.embed) if self.embed is not None else torch.zeros(len(eps)))
        failed = [not e.success for e in eps]
        step.metrics["shaping_reward_mean"] = float(bonus[torch.tensor(failed)].mean()) if any(failed) else 0.0
        return replace(returns, turn=add_final_turn_bonus(returns.turn, returns.valid, bonus), total=None)
