"""Advantages and losses against values computed by hand."""
import math

import pytest
import torch

from protege.rl.advantages import group_advantages
from protege.rl.losses import aggregate_dr_grpo, aggregate_grpo, clipped_surrogate, kl_k3, policy_loss


def test_dr_grpo_advantage_is_centred_reward():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    a = group_advantages(r, scale_by_std=False)
    assert torch.allclose(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]))


def test_grpo_advantage_divides_by_std_plus_eps():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    a = group_advantages(r, scale_by_std=True)
    std = math.sqrt((4 * 0.25) / 3)  # unbiased sample std of [1, 0, 0, 1] = 0.57735
    assert a[0, 0].item() == pytest.approx(0.5 / (std + 1e-4), rel=1e-12)
    assert a[0, 1].item() == pytest.approx(-0.5 / (std + 1e-4), rel=1e-12)
    flat = group_advantages(torch.ones(1, 4), scale_by_std=True)
    assert torch.equal(flat, torch.zeros(1, 4))  # equal rewards: no signal, no division blow-up


def test_clipped_surrogate_by_hand():
    logp = torch.log(torch.tensor([[1.5, 1.0], [1.5, 0.5]]))
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    loss, clipped = clipped_surrogate(logp, old, adv, clip_eps=0.2)
    # row 0, A=+1: ratios 1.5 -> min(1.5, 1.2) = 1.2 (clipped); 1.0 -> 1.0
    # row 1, A=-1: ratio 1.5 -> min(-1.5, -1.2) = -1.5; ratio 0.5 -> min(-0.5, -0.8) = -0.8 (clipped)
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.0], [1.5, 0.8]]))
    assert clipped.tolist() == [[True, False], [False, True]]


def test_k3_by_hand():
    logp = torch.log(torch.tensor([1.5, 1.0]))
    ref = torch.zeros(2)
    # d = -log 1.5: exp(d) - d - 1 = 2/3 + 0.405465 - 1 = 0.072132; zero when equal
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([0.0721318, 0.0]), atol=1e-6)


def test_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate_dr_grpo(per_token, mask, max_len=4).item() == pytest.approx(7 / 8)  # (1+2+4)/(2*4)
    assert aggregate_grpo(per_token, mask).item() == pytest.approx((1.5 + 4.0) / 2)


def test_policy_loss_at_ratio_one_is_minus_mean_advantage_share():
    logp = torch.log(torch.full((2, 3), 0.5))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([0.5, -0.5])
    loss, stats = policy_loss(logp, logp, logp, adv, mask, clip_eps=0.2, kl_beta=0.04,
                              aggregation="dr_grpo", max_len=4)
    # -(0.5*3 - 0.5*1) / (2*4) = -0.125; KL is 0 when policy == ref
    assert loss.item() == pytest.approx(-0.125)
    assert stats["kl"].item() == 0 and stats["clip_fraction"].item() == 0
    with pytest.raises(ValueError, match="unknown aggregation"):
        policy_loss(logp, logp, logp, adv, mask, clip_eps=0.2, kl_beta=0.0, aggregation="mean", max_len=4)


def test_dr_grpo_gradient_accumulation_equivalence():
    """micro-batch 1 x 4 accumulation steps == micro-batch 4 x 1 (float64, 1e-6)."""
    torch.manual_seed(0)
    w = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)  # a tiny "policy": logits = x @ w
    x = torch.randn(4, 3, 5, dtype=torch.float64)  # [N, L, d]
    tokens = torch.randint(0, 7, (4, 3))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([0.7, -0.2, -0.9, 0.4], dtype=torch.float64)
    old = torch.log_softmax(x @ w.detach() * 0.9, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ref = torch.log_softmax(x @ w.detach() * 1.1, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    def loss_of(sl):
        logp = torch.log_softmax(x[sl] @ w, -1).gather(-1, tokens[sl].unsqueeze(-1)).squeeze(-1)
        return policy_loss(logp, old[sl], ref[sl], adv[sl], mask[sl], clip_eps=0.2, kl_beta=0.04,
                           aggregation="dr_grpo", max_len=3)[0]

    full = torch.autograd.grad(loss_of(slice(0, 4)), w)[0]
    acc = torch.zeros_like(w)
    for i in range(4):  # each micro-batch's loss carries its share (1/4) of the sequences
        acc += torch.autograd.grad(loss_of(slice(i, i + 1)) / 4, w)[0]
    assert torch.allclose(full, acc, atol=1e-6, rtol=0)
    assert full.abs().sum() > 0


def test_similarity_rewards():
    from protege.rewards.similarity import similarity_reward

    d = torch.tensor([0.1, 0.49, 0.5, 0.9])
    assert similarity_reward(d, "binary").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert torch.allclose(similarity_reward(d, "continuous"), torch.tensor([0.9, 0.51, 0.5, 0.1]))
    assert similarity_reward(d, "levels:2").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert similarity_reward(d, "levels:3").tolist() == [1.0, 0.5, 0.5, 0.0]  # 1 - D rounded to {0, .5, 1}
    with pytest.raises(ValueError):
        similarity_reward(d, "levels:1")


def test_rollout_importance_weights_are_truncated_and_leave_other_tokens_alone():
    from protege.rl.losses import rollout_is_weights

    logp_old = torch.tensor([[-1.0, -2.0, -3.0]])
    logp_rollout = torch.tensor([[-1.5, -1.0, -9.0]])
    sampled = torch.tensor([[1.0, 1.0, 0.0]])  # the last token was not the engine's (a teacher's, padding)
    w = rollout_is_weights(logp_old, logp_rollout, sampled, cap=1.5)
    # exp(0.5) = 1.6487 -> the cap 1.5; exp(-1) = 0.3679 kept; not sampled -> 1
    assert torch.allclose(w, torch.tensor([[1.5, 0.36787944, 1.0]]))
    assert not w.requires_grad


def test_rl4vlm_objective_takes_one_ratio_per_output_with_the_thought_weighted():
    """Two outputs (turns) of one row: tokens [t, t, a | t, a], weights 0.5 on thought tokens, 1 on the rest.
    Output 0: log-prob moves +0.2 and +0.2 on thoughts, +0.4 on the action: 0.5 * 0.4 + 0.4 = 0.6, r = e^0.6
    = 1.822, clipped at 1.1 with A = +1: -1.1. Output 1: -0.2 on its thought, 0 on the action: -0.1, r = 0.905,
    A = -2: min(0.905 * -2, 0.9 * -2) = -1.81, so +1.81. Mean over the 2 outputs: (-1.1 + 1.81) / 2 = 0.355."""
    from protege.rl.losses import output_ratio_loss

    logp_old = torch.zeros(1, 5)
    logp = torch.tensor([[0.2, 0.2, 0.4, -0.2, 0.0]], requires_grad=True)
    weights = torch.tensor([[0.5, 0.5, 1.0, 0.5, 1.0]])
    cell = torch.tensor([[0, 0, 0, 1, 1]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = output_ratio_loss(logp, logp_old, weights, cell, adv, clip_eps=0.1)
    expected = (-1.1 + 2 * math.exp(-0.1)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)  # output 0's clip was active
    loss.backward()  # output 0 is clipped (no gradient); output 1: d/dlogp of -(r * A) / 2 = -A r w / 2
    g = 2 * math.exp(-0.1) / 2
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 0.0, 0.5 * g, g]]), atol=1e-6)
    # as a micro-batch holding output 1 alone, its share of the 2-output batch
    part, _ = output_ratio_loss(logp.detach()[:, 3:], logp_old[:, 3:], weights[:, 3:], cell[:, 3:], adv, 0.1, cells=2)
    assert part.item() == pytest.approx(2 * math.exp(-0.1) / 2, abs=1e-6)
