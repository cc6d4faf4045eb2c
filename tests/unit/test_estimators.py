"""Advantage estimators: hand-computed values, the registry, and a fourth estimator reached by name only."""
import math
from pathlib import Path

import pytest
import torch

from protege.config import AgentRLConfig, RLConfig
from protege.errors import UserFacingError
from protege.rl.estimators import ESTIMATORS, Returns, estimator


def test_rloo_subtracts_the_mean_of_the_other_answers():
    r = Returns.single_turn(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]), group_size=4)
    adv = ESTIMATORS["rloo"](r, RLConfig()).flatten()
    # group 1: 1 - (0+0+0)/3 = 1; 0 - (1+0+0)/3 = -1/3; group 2: all equal -> 0
    assert torch.allclose(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0, 0.0]))


def test_grpo_batch_scales_by_the_batch_std_not_each_groups():
    # group 1: all succeed, KL noise of +-0.05; group 2: one success in two
    r = Returns.single_turn(torch.tensor([0.95, 1.05, 1.0, 0.0]), group_size=2)
    batch_std = torch.tensor([0.95, 1.05, 1.0, 0.0]).std()  # unbiased, over all four
    adv = ESTIMATORS["grpo_batch"](r, AgentRLConfig()).flatten()
    assert torch.allclose(adv, torch.tensor([-0.05, 0.05, 0.5, -0.5]) / (batch_std + 1e-4))
    assert adv[:2].abs().max() < 0.2  # GRPO gives the noisy group -+1/sqrt(2), as much as a real success
    assert torch.allclose(ESTIMATORS["grpo"](r, AgentRLConfig()).flatten()[:2], torch.tensor([-1.0, 1.0]) / math.sqrt(2),
                          atol=0.01)


def test_grpo_and_dr_grpo_carry_one_advantage_on_every_turn():
    # two episodes of one group: returns 1 and 0 over 2 and 1 turns
    r = Returns(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.tensor([[True, True], [True, False]]), group_size=2)
    assert r.episode.tolist() == [1.0, 0.0]  # no total given: the sum of the turn rewards
    dr = ESTIMATORS["dr_grpo"](r, AgentRLConfig())
    assert dr.tolist() == [[0.5, 0.5], [-0.5, 0.0]]  # centred, 0 past the episode's end
    g = ESTIMATORS["grpo"](r, AgentRLConfig())
    s = math.sqrt(0.5) + 1e-4  # unbiased std of (1, 0), + eps
    assert torch.allclose(g, torch.tensor([[0.5 / s, 0.5 / s], [-0.5 / s, 0.0]]))


def test_gtpo_normalises_discounted_turn_returns():
    cfg = AgentRLConfig(algorithm="gtpo", gtpo={"gamma": 0.5, "scope": "turn"})
    r = Returns(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.ones(2, 2, dtype=torch.bool), group_size=2)
    adv = ESTIMATORS["gtpo"](r, cfg)
    # returns-to-go: episode 1 (0.5, 1), episode 2 (0, 0); per turn index over the group: +-x/(std + eps)
    a0, a1 = 0.25 / (math.sqrt(0.125) + 1e-4), 0.5 / (math.sqrt(0.5) + 1e-4)
    assert torch.allclose(adv, torch.tensor([[a0, a1], [-a0, -a1]]))
    with pytest.raises(UserFacingError, match="gtpo section"):
        ESTIMATORS["gtpo"](r, RLConfig())


def test_the_algorithm_picks_the_estimator_unless_advantage_names_one():
    def own(f):  # the module's estimate under the wrapper that adds Returns.after
        return getattr(f, "__wrapped__", f)

    assert own(estimator(RLConfig(algorithm="ril"))) is ESTIMATORS["dr_grpo"]  # RIL's 2G group, Dr.GRPO's advantage
    assert own(estimator(RLConfig(algorithm="grpo"))) is ESTIMATORS["grpo"]
    assert own(estimator(AgentRLConfig(algorithm="gtpo", advantage="rloo"))) is ESTIMATORS["rloo"]
    assert estimator(AgentRLConfig(algorithm="ppo")) is ESTIMATORS["gae"]  # shifts before its normalisation
    with pytest.raises(UserFacingError, match="'ppo': no such estimator; known: dr_grpo, gae, grpo, grpo_batch, gtpo, rloo"):
        estimator(RLConfig(advantage="ppo"))
    with pytest.raises(ValueError, match="advantage"):
        RLConfig(advantage="../evil")


def test_every_estimator_module_is_registered_under_its_file_name():
    folder = Path(__import__("protege.rl.estimators", fromlist=["x"]).__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "base"}
    assert modules == set(ESTIMATORS)


def test_a_term_on_the_returns_moves_only_its_turns_advantage():
    """GTR-Turbo's KL as its code adds it: after GAE, on the step's return. A penalty of 0.5 on turn 1 of
    rewards [0, 1] (V = 0, gamma 0.9, lambda 0.95): GAE gives [0.855, 1.0], shifted [0.855, 0.5]; the same
    penalty on the reward would also reach turn 0: [0.9 * 0.95 * 0.5, 0.5] = [0.4275, 0.5]."""
    from protege.config import AgentRLConfig
    from protege.rl.estimators import estimator
    from protege.rl.estimators.base import Returns, shifted
    from protege.rl.ppo import gae

    cfg = AgentRLConfig(algorithm="ppo")
    valid = torch.tensor([[True, True]])
    after = torch.tensor([[0.0, -0.5]])
    r = Returns(torch.tensor([[0.0, 1.0]]), valid, 1, values=torch.zeros(1, 2), after=after)
    raw = shifted(gae(r.turn, r.values, valid, 0.9, 0.95)[0], r)
    assert torch.allclose(raw, torch.tensor([[0.855, 0.5]]))
    on_reward = gae(torch.tensor([[0.0, 0.5]]), torch.zeros(1, 2), valid, 0.9, 0.95)[0]
    assert torch.allclose(on_reward, torch.tensor([[0.4275, 0.5]]))
    # the estimator shifts before its batch normalisation, as the code shifts the returns it normalises
    want = (raw - raw.mean()) / (raw.std() + 1e-4)
    assert torch.allclose(estimator(cfg)(r, cfg), want, atol=1e-6)
    # a group estimator: its own advantages, then the shift
    grpo = AgentRLConfig(algorithm="grpo")
    g = Returns(torch.tensor([[1.0], [0.0]]), torch.ones(2, 1, dtype=torch.bool), 2, after=torch.tensor([[-0.25], [0.0]]))
    plain = estimator(grpo)(Returns(g.turn, g.valid, 2), grpo)
    assert torch.allclose(estimator(grpo)(g, grpo), plain + torch.tensor([[-0.25], [0.0]]))
