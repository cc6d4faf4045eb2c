"""Guidance terms shape the rewards in order: GTPO's shaping adds its bonus to a failed episode's last turn
and credits the episode with the sum of its turn rewards."""
from types import SimpleNamespace

import torch

from protege.config import AgentRLConfig
from protege.generation.transformers_backend import Sampling
from protege.rl.agent_loop import guidance_terms
from protege.rl.estimators import Returns
from protege.rl.guidance.base import Guidance, Step
from protege.rl.guidance.merged_teacher import MergedTeacherGuidance
from protege.rl.guidance.shaping import SimilarityShaping


def episode(code: str, success: bool):
    return SimpleNamespace(infos=[{"code": code}], success=success)


def test_shaping_adds_the_bonus_on_the_last_turn_and_credits_the_turn_sum():
    eps = [episode("x = 1 + 2\nprint(x)", True), episode("x = 1 + 2\nprint(x)", False)]  # one group of 2
    turn = torch.tensor([[0.0, 1.0], [-0.1, 0.0]])
    valid = torch.tensor([[True, True], [True, False]])
    step = Step(None, eps, None, None, None, torch.device("cpu"), {})
    shaped = SimilarityShaping(alpha=0.5, embedder=None).shape(step, Returns(turn, valid, 2, total=torch.tensor([9.0, 9.0])))
    # the failed episode's code equals the successful one's: cosine 1, bonus 0.5 on its last valid turn (turn 0)
    assert torch.allclose(shaped.turn, torch.tensor([[0.0, 1.0], [0.4, 0.0]]))
    assert torch.allclose(shaped.episode, torch.tensor([1.0, 0.4]))  # the sum of turns, not the old total
    assert step.metrics["shaping_reward_mean"] == 0.5


def test_the_terms_a_config_switches_on_and_their_order():
    policy = torch.nn.Linear(2, 2)
    none = guidance_terms(AgentRLConfig(algorithm="grpo", gtr={"guidance": "none"}), None, policy, None, None,
                          None, torch.device("cpu"))
    assert none == []
    both = guidance_terms(AgentRLConfig(algorithm="gtpo", gtr={"guidance": "kl"}), torch.nn.Linear(2, 2), policy,
                          None, Sampling(do_sample=True, temperature=1.0, top_k=50), None, torch.device("cpu"))
    assert [type(t) for t in both] == [SimilarityShaping, MergedTeacherGuidance]  # shaping before the KL cost
    assert set(both[1].parts) == {"merged_teacher"}
    # the merged teacher samples its thoughts at GTR-Turbo's temperature 0.2, top-k 5
    assert (both[1].sampling.temperature, both[1].sampling.top_k, both[1].sampling.do_sample) == (0.2, 5, True)


def test_a_term_does_nothing_unless_it_overrides_a_hook():
    r = Returns.single_turn(torch.tensor([1.0, 0.0]), 2)
    term = Guidance()
    assert term.shape(None, r) is r and list(term.loss(None)) == [] and term.parts == {}
