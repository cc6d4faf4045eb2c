"""PPO over turns: GAE and the value loss on hand-computed values, and the value of each turn's state."""
import pytest
import torch

from protege.rl.estimators import ESTIMATORS, Returns
from protege.rl.ppo import gae, turn_values, value_loss
from protege.rollout.trajectory import Trajectory


def test_gae_by_hand():
    # episode 0: two turns, rewards 0 and 1, V = 0.5 and 0.8; episode 1: one turn, reward -0.5, V = 0.2
    r = torch.tensor([[0.0, 1.0], [-0.5, 0.0]])
    v = torch.tensor([[0.5, 0.8], [0.2, 9.0]])  # 9.0 sits on a turn episode 1 does not have
    valid = torch.tensor([[True, True], [True, False]])
    adv, targets = gae(r, v, valid, gamma=0.9, lam=0.95)
    # ep 0, turn 1 (last): delta = 1 - 0.8 = 0.2 -> A = 0.2
    # ep 0, turn 0: delta = 0 + 0.9 * 0.8 - 0.5 = 0.22; A = 0.22 + 0.9 * 0.95 * 0.2 = 0.391
    # ep 1, turn 0 (last): delta = -0.5 - 0.2 = -0.7
    assert torch.allclose(adv, torch.tensor([[0.391, 0.2], [-0.7, 0.0]]))
    assert torch.allclose(targets, torch.tensor([[0.891, 1.0], [-0.5, 0.0]]))
    # lam = 1, V = 0: discounted returns
    adv1, _ = gae(r, torch.zeros_like(v), valid, gamma=0.9, lam=1.0)
    assert torch.allclose(adv1, torch.tensor([[0.9, 1.0], [-0.5, 0.0]]))


def test_gae_estimator_normalises_over_every_turn_of_the_batch():
    from protege.config import AgentRLConfig

    r = torch.tensor([[0.0, 1.0], [-0.5, 0.0]])
    valid = torch.tensor([[True, True], [True, False]])
    ret = Returns(r, valid, 2, values=torch.zeros(2, 2))
    a = ESTIMATORS["gae"](ret, AgentRLConfig(algorithm="ppo", ppo={"lam": 1.0}))
    raw = torch.tensor([0.9, 1.0, -0.5])
    assert torch.allclose(a[valid], (raw - raw.mean()) / (raw.std() + 1e-4)) and a[1, 1] == 0
    with pytest.raises(Exception, match="needs a value head"):
        ESTIMATORS["gae"](Returns(r, valid, 2), AgentRLConfig(algorithm="ppo"))


def test_value_loss_counts_valid_turns_only():
    v = torch.tensor([[1.0, 2.0], [0.0, 5.0]])
    t = torch.tensor([[0.0, 2.0], [2.0, -9.0]])
    valid = torch.tensor([[True, True], [True, False]])
    assert value_loss(v, t, valid).item() == pytest.approx(0.5 * (1 + 0 + 4) / 3)


def test_a_turns_value_is_read_at_its_first_policy_token():
    # row 0 holds episode 0's two turns (context full), row 1 episode 1's one turn
    loss_mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 1, 1, 0]])
    turn = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, -1]])
    traj = Trajectory({"input_ids": torch.zeros(2, 6, dtype=torch.long)}, loss_mask, turn,
                      owner=torch.tensor([0, 1]))
    values = torch.arange(10, dtype=torch.float32).view(2, 5)
    assert torch.equal(turn_values(values, traj, episodes=2, turns=2), torch.tensor([[1.0, 4.0], [7.0, 0.0]]))


def test_clipped_value_loss_takes_the_larger_term_and_stops_v_beyond_the_clip():
    # turn 1: V moved 1.0 from old 1.0 towards target 3: clipped V = 1.1, (1.1 - 3)^2 = 3.61 > (2 - 3)^2 = 1
    # turn 2: V moved 0.05 (inside the clip) from old 1.0 towards 0: both terms (0.95 - 0)^2 = 0.9025
    v = torch.tensor([[2.0, 0.95]], requires_grad=True)
    old, t, valid = torch.tensor([[1.0, 1.0]]), torch.tensor([[3.0, 0.0]]), torch.tensor([[True, True]])
    loss = value_loss(v, t, valid, old=old, clip=0.1)
    assert loss.item() == pytest.approx(0.5 * (3.61 + 0.9025) / 2)
    loss.backward()
    # the clipped turn gives V no gradient; the other gives 0.5 * 2 * 0.95 / 2 turns
    assert v.grad.tolist()[0] == pytest.approx([0.0, 0.475])
    # without old, the plain squared error
    assert value_loss(v, t, valid).item() == pytest.approx(0.5 * (1.0 + 0.9025) / 2)
