"""GTR-Turbo's merged teacher against the closed form over every checkpoint so far, and the guidance
terms (KL penalty, thought cross-entropy) on hand-computed values."""
import pytest
import torch

from protege.rl.losses import clipped_surrogate, format_bonus, merged_kl_penalty, unparsed_kl
from protege.rollout.trajectory import thought_sft_loss
from protege.rl.merged_teacher import MergedTeacher

INIT = {"w": torch.tensor([0.0, 1.0, -2.0, 4.0]), "b": torch.tensor([[1.0, 1.0]])}


def checkpoints(k):
    g = torch.Generator().manual_seed(3)
    return [{n: v + torch.randn(v.shape, generator=g) for n, v in INIT.items()} for _ in range(k)]


@pytest.mark.parametrize("k", [1, 2, 7, 25])
def test_average_is_the_mean_of_all_checkpoints(k):
    cs = checkpoints(k)
    m = MergedTeacher(INIT, "average")
    for c in cs:
        m.add(c)
    for n in INIT:
        expected = sum(c[n] for c in cs) / k
        assert torch.allclose(m.merged[n], expected, atol=1e-6)
    assert m.count == k


def test_average_includes_the_newest_checkpoint_every_time():
    # a merge that stopped taking new checkpoints would stay put; this one moves by (c_k - M_{k-1}) / k
    m = MergedTeacher({"w": torch.zeros(1)}, "average")
    for k, value in enumerate([3.0, 6.0, 0.0, 100.0], start=1):
        m.add({"w": torch.tensor([value])})
    assert m.merged["w"].item() == pytest.approx((3 + 6 + 0 + 100) / 4)


def test_ema_closed_form():
    a, cs = 0.25, checkpoints(5)
    m = MergedTeacher(INIT, "ema", ema_alpha=a)
    for c in cs:
        m.add(c)
    k = len(cs)
    for n in INIT:
        expected = (1 - a) ** k * INIT[n] + sum(a * (1 - a) ** (k - j) * cs[j - 1][n] for j in range(1, k + 1))
        assert torch.allclose(m.merged[n], expected, atol=1e-6)


def test_ties_over_task_vectors_by_hand():
    init = {"w": torch.zeros(4)}
    m = MergedTeacher(init, "ties", ties_density=0.5)
    m.add({"w": torch.tensor([4.0, -1.0, 0.5, -3.0])})   # trimmed to 50%: [4, 0, 0, -3]
    assert torch.allclose(m.merged["w"], torch.tensor([4.0, 0.0, 0.0, -3.0]))
    m.add({"w": torch.tensor([-2.0, 0.1, 5.0, -1.0])})   # trimmed: [-2, 0, 5, 0]
    # elected signs (sign of the sum of trimmed vectors): [+, 0->+, +, -]; disjoint mean over agreeing:
    # w0: only 4 agrees -> 4; w1: nothing -> 0; w2: 5 -> 5; w3: -3 -> -3
    assert torch.allclose(m.merged["w"], torch.tensor([4.0, 0.0, 5.0, -3.0]))
    m.add({"w": torch.tensor([2.0, 0.0, 1.0, 1.0])})     # trimmed (top 2 of |.|): [2, 0, 1, 0]
    # sums: [4, 0, 6, -3]; w0 mean of 4 and 2 -> 3; w2 mean of 5 and 1 -> 3
    assert torch.allclose(m.merged["w"], torch.tensor([3.0, 0.0, 3.0, -3.0]))
    assert len(m.task_vectors) == 3


def test_ties_running_weighs_every_checkpoint_alike_by_hand():
    m = MergedTeacher({"w": torch.zeros(4)}, "ties_running", ties_density=0.5)
    m.add({"w": torch.tensor([4.0, -1.0, 0.5, -3.0])})   # weights 0 and 1; trimmed to [4, 0, 0, -3]
    assert torch.allclose(m.merged["w"], torch.tensor([4.0, 0.0, 0.0, -3.0]))  # M_1 = c_1 where TIES keeps it
    m.add({"w": torch.tensor([-2.0, 0.1, 5.0, -1.0])})   # weights 1/2 and 1/2; trimmed: [4, 0, 0, -3], [-2, 0, 5, 0]
    # elected signs of 0.5 * [4, 0, 0, -3] + 0.5 * [-2, 0, 5, 0] = [1, 0, 2.5, -1.5]: [+, 0, +, -];
    # the agreeing entries times their weights, not renormalised: [0.5 * 4, 0, 0.5 * 5, 0.5 * -3]
    assert torch.allclose(m.merged["w"], torch.tensor([2.0, 0.0, 2.5, -1.5]))
    m.add({"w": torch.tensor([3.0, 0.0, 0.0, 3.0])})     # weights 2/3 and 1/3; trimmed: [2, 0, 2.5, -1.5], [3, 0, 0, 3]
    # sum 2/3 * [2, 0, 2.5, -1.5] + 1/3 * [3, 0, 0, 3] = [7/3, 0, 5/3, 0]: a sum of 0 elects + (mergekit's
    # rule: sum >= 0), so entry 3 keeps the new checkpoint's +3; kept: [2/3 * 2 + 1/3 * 3, 0, 2/3 * 2.5, 1/3 * 3]
    assert torch.allclose(m.merged["w"], torch.tensor([7 / 3, 0.0, 5 / 3, 1.0]))
    assert m.task_vectors == []  # one running copy


def test_the_control_arms_keep_their_teacher():
    init = {"w": torch.zeros(2)}
    anchored = MergedTeacher(init, "average", teacher="init")  # a KL anchor to the warm start
    first = MergedTeacher(init, "average", teacher="first")   # stops after the first update's merge
    for m in (anchored, first):
        m.add({"w": torch.tensor([2.0, 4.0])})  # update 1, epoch 1
        m.add({"w": torch.tensor([4.0, 0.0])})  # update 1, epoch 2
        m.end_update()
        m.add({"w": torch.tensor([9.0, 9.0])})  # update 2: not merged by either arm
        m.end_update()
    assert torch.equal(anchored.merged["w"], torch.zeros(2)) and anchored.count == 0
    assert torch.equal(first.merged["w"], torch.tensor([3.0, 2.0])) and first.count == 2
    tensors, extras = first.dump()
    with pytest.raises(ValueError, match="the 'first' arm, this run's is 'running'"):
        MergedTeacher(init, "average").load(tensors, extras)
    with pytest.raises(ValueError, match="expected running, init or first"):
        MergedTeacher(init, "average", teacher="frozen")


@pytest.mark.parametrize("method", ["average", "ema", "ties", "ties_running"])
def test_state_round_trip(method):
    cs = checkpoints(4)
    a, b = MergedTeacher(INIT, method), MergedTeacher(INIT, method)
    for c in cs[:2]:
        a.add(c)
    tensors, extras = a.dump()
    b.load(tensors, extras)
    for c in cs[2:]:
        a.add(c)
        b.add(c)
    for n in INIT:
        assert torch.equal(a.merged[n], b.merged[n])


def test_load_into_writes_the_merge():
    model = torch.nn.Linear(2, 1, bias=False)
    m = MergedTeacher({"weight": model.weight.detach().clone()}, "average")
    m.add({"weight": torch.tensor([[2.0, 4.0]])})
    m.load_into(model)
    assert torch.equal(model.weight.detach(), torch.tensor([[2.0, 4.0]]))


def test_bad_inputs():
    with pytest.raises(ValueError, match="expected average, ema, ties or ties_running"):
        MergedTeacher(INIT, "soup")
    m = MergedTeacher(INIT, "average")
    with pytest.raises(ValueError, match="differ"):
        m.add({"w": torch.zeros(4)})


def test_kl_penalty_is_clamped_and_averaged_over_each_turns_thought_tokens():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.0], [-3.0, -1.0, -9.0, -1.0]])
    logp_m = torch.tensor([[-2.0, -1.0, -20.5, -5.0], [-4.0, -1.5, -1.0, -1.0]])
    thought = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])  # row 0's last token: its action
    turn = torch.tensor([[0, 0, 1, 1], [0, 0, 0, -1]])
    owner = torch.tensor([0, 1])
    # episode 0, turn 0: d = [1, -1 -> 0] -> 0.5; turn 1: d = [20 -> 10] (the action's 4 left out) -> 10
    # episode 1, turn 0: d = [1, 0.5] (the third token is no thought) -> 0.75; turn 1: nothing -> 0
    out = merged_kl_penalty(logp, logp_m, thought, turn, owner, episodes=2, turns=2, clamp_max=10.0)
    assert torch.allclose(out, torch.tensor([[0.5, 10.0], [0.75, 0.0]]))


def test_kl_penalty_of_an_episode_spread_over_rows():
    # context "current": one row per turn, rows 0 and 1 are episode 0's turns 0 and 1, row 2 episode 1's turn 0
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -1.0], [-1.0, -1.0]])
    logp_m = torch.tensor([[-2.0, -1.0], [-4.0, -3.0], [-1.0, -1.0]])
    thought = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    turn = torch.tensor([[0, 0], [1, 1], [0, 0]])
    out = merged_kl_penalty(logp, logp_m, thought, turn, torch.tensor([0, 0, 1]), episodes=2, turns=2)
    assert torch.allclose(out, torch.tensor([[0.5, 1.0], [0.0, 0.0]]))


def test_thought_sft_loss_ignores_action_tokens():
    logp = torch.tensor([[-1.0, -3.0, -100.0], [-2.0, -100.0, -100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert thought_sft_loss(logp, mask).item() == pytest.approx((1 + 3 + 2) / 3)


def test_surrogate_takes_per_token_advantages():
    logp = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -2.0, 0.5]])
    loss, _ = clipped_surrogate(logp, logp, adv, 0.2)
    assert torch.allclose(loss, -adv)


def test_an_unparsed_turn_pays_the_codes_fixed_kl():
    penalty = torch.tensor([[0.5, 10.0], [0.75, 0.0]])
    formed = torch.tensor([[True, False], [True, False]])
    assert torch.equal(unparsed_kl(penalty, formed, 100.0), torch.tensor([[0.5, 100.0], [0.75, 100.0]]))
    assert torch.equal(unparsed_kl(penalty, formed, None), penalty)  # null: the KL over all its tokens stands


def test_format_bonus_by_turn_and_nothing_past_the_episode():
    formed = torch.tensor([[True, False, False], [False, True, True]])
    valid = torch.tensor([[True, True, False], [True, True, True]])  # episode 0 has two turns
    out = format_bonus(formed, valid, ok=3.0, bad=-2.0)
    assert torch.equal(out, torch.tensor([[3.0, -2.0, 0.0], [-2.0, 3.0, 3.0]]))
