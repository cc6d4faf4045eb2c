"""The question loop's TRL / verl / DAPO settings as pure functions, against values computed by hand: KL
estimators, clip-higher, the four loss aggregations (and their micro-batch shares), the entropy bonus, the soft
overlong punishment, the KL taken off the rewards, which answers count as cut; and how each setting is checked."""
import math
from types import SimpleNamespace

import pytest
import torch

from protege.config import ConfigError, RLConfig, load_config, result_params
from protege.generation.transformers_backend import Completions
from protege.rl.estimators.base import Returns
from protege.rl.losses import (AGGREGATIONS, KL_ESTIMATORS, aggregate, clipped_surrogate, kl_k1, kl_k2, kl_k3,
                               kl_low_var, overlong_penalty, policy_loss, turn_sums)
from protege.rl.objectives.base import Old
from protege.rl.objectives.clipped import ClippedSurrogate, aggregation_of
from protege.rl.rollouts.questions import Questions
from protege.rl.sample import Sample
from protege.rollout.trajectory import Trajectory

# log pi - log pi_ref of three tokens: 0, 0.5, -0.5
LOGP = torch.tensor([0.0, 0.5, -0.5], dtype=torch.float64)
REF = torch.zeros(3, dtype=torch.float64)


def test_k1_is_the_log_ratio():
    assert kl_k1(LOGP, REF).tolist() == [0.0, 0.5, -0.5]


def test_k2_is_half_the_squared_log_ratio():
    assert kl_k2(LOGP, REF).tolist() == [0.0, 0.125, 0.125]


def test_k3_by_hand():
    # d = log pi_ref - log pi = 0, -0.5, 0.5: exp(d) - d - 1
    want = [0.0, math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1]  # 0, 0.1065307, 0.1487213
    assert kl_k3(LOGP, REF).tolist() == pytest.approx(want, abs=1e-15)
    assert want[1] == pytest.approx(0.1065306597, abs=1e-10) and want[2] == pytest.approx(0.1487212707, abs=1e-10)


def test_low_var_is_k3_clamped_to_ten():
    assert kl_low_var(LOGP, REF).tolist() == pytest.approx(kl_k3(LOGP, REF).tolist(), abs=1e-15)
    far = torch.tensor([-30.0, 30.0], dtype=torch.float64)  # the reference 30 nats likelier, then 30 less likely
    assert kl_k3(far, torch.zeros(2, dtype=torch.float64)).tolist() == pytest.approx([math.exp(30) - 31, 29.0])
    assert kl_low_var(far, torch.zeros(2, dtype=torch.float64)).tolist() == [10.0, 10.0]
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3", "low_var"}


def test_clip_higher_by_hand():
    ratios = torch.tensor([[1.5, 1.25], [0.7, 0.7]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0], [-1.0, 1.0]], dtype=torch.float64)
    loss, clipped = clipped_surrogate(torch.log(ratios), torch.zeros(2, 2, dtype=torch.float64), adv, 0.2, 0.28)
    # A=+1: r=1.5 -> min(1.5, 1.28) = 1.28 (clipped); r=1.25 -> 1.25, inside the higher range (0.2 would clip it)
    # r=0.7, A=-1 -> min(-0.7, -0.8) = -0.8 (clipped at 1 - 0.2); A=+1 -> min(0.7, 0.8) = 0.7
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -1.25], [0.8, -0.7]], dtype=torch.float64))
    assert clipped.tolist() == [[True, False], [True, False]]
    symmetric, was = clipped_surrogate(torch.log(ratios), torch.zeros(2, 2, dtype=torch.float64), adv, 0.2)
    assert symmetric[0].tolist() == pytest.approx([-1.2, -1.2]) and was[0].tolist() == [True, True]


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
BY_HAND = {"token_mean": 7 / 3,             # (1 + 2 + 4) / 3 tokens
           "seq_mean_token_mean": 2.75,     # ((1 + 2) / 2 + 4 / 1) / 2 answers
           "seq_mean_token_sum": 3.5,       # ((1 + 2) + 4) / 2 answers
           "dr_grpo": 7 / 8}                # (1 + 2 + 4) / (2 answers x 4 max tokens)


@pytest.mark.parametrize("how", AGGREGATIONS)
def test_each_aggregation_by_hand_and_its_micro_batch_shares_add_up(how):
    assert aggregate(PER_TOKEN, MASK, how, max_len=4).item() == pytest.approx(BY_HAND[how])
    # one answer per micro-batch, each normalised by the whole batch's answers and tokens
    shares = [aggregate(PER_TOKEN[i:i + 1], MASK[i:i + 1], how, max_len=4, rows=2, tokens=3.0) for i in range(2)]
    assert sum(s.item() for s in shares) == pytest.approx(BY_HAND[how], rel=1e-12)
    with pytest.raises(ValueError, match="unknown aggregation 'seq_mean'"):
        aggregate(PER_TOKEN, MASK, "seq_mean", max_len=4)


def test_the_algorithms_own_aggregation_and_a_named_one():
    assert [aggregation_of(RLConfig(algorithm=a)) for a in ("grpo", "dr_grpo", "ril")] == [
        "seq_mean_token_mean", "dr_grpo", "dr_grpo"]
    assert aggregation_of(RLConfig(algorithm="dr_grpo", loss_aggregation="token_mean")) == "token_mean"
    agent = SimpleNamespace(algorithm="ppo")  # a section without the setting: its algorithm's own
    assert aggregation_of(agent) == "seq_mean_token_mean"


def test_entropy_bonus_lowers_the_loss_by_coef_times_the_mean_entropy():
    logp = torch.log(torch.full((2, 3), 0.5, dtype=torch.float64))
    entropy = torch.tensor([[2.0, 4.0, 99.0], [6.0, 99.0, 99.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.zeros(2, dtype=torch.float64)  # no policy-gradient signal; the KL is 0 at pi = pi_ref
    loss, _ = policy_loss(logp, logp, logp, adv, MASK, clip_eps=0.2, kl_beta=0.04, aggregation="token_mean",
                          max_len=4, entropy=entropy, entropy_coef=0.1)
    assert loss.item() == pytest.approx(-0.1 * (2 + 4 + 6) / 3)
    loss.backward()  # each scored token's entropy pushed up alike, the others not at all
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.1 / 3, -0.1 / 3, 0.0], [-0.1 / 3, 0.0, 0.0]],
                                                      dtype=torch.float64))


def test_policy_loss_takes_the_kl_estimator_by_name():
    logp = torch.tensor([[0.5, -0.5]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    for name, want in (("k1", 0.0), ("k2", 0.125), ("k3", (math.exp(-0.5) + math.exp(0.5) - 2) / 2)):
        _, stats = policy_loss(logp, logp, torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                               mask, clip_eps=0.2, kl_beta=1.0, aggregation="token_mean", max_len=2,
                               kl_estimator=name)
        assert stats["kl"].item() == pytest.approx(want, abs=1e-12)


def test_soft_overlong_punishment_by_hand():
    # DAPO eq. 13 with L_max = 10, L_cache = 4: 0 up to 6 tokens, ((10 - 4) - len) / 4 over 7..10, -1 beyond
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == pytest.approx([0, 0, -0.25, -0.5, -1.0, -1.0])
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == pytest.approx([0, 0, -0.125, -0.25, -0.5, -0.5])


def test_turn_sums_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    turn = torch.tensor([[0, 0, -1], [1, 1, 1], [0, -1, -1]])
    sums = turn_sums(per_token, mask, torch.tensor([0, 0, 1]), turn, episodes=2, turns=2)
    assert sums.tolist() == [[3.0, 15.0], [7.0, 0.0]]


def one_turn_sample(mask: torch.Tensor) -> Sample:
    n, width = mask.shape
    turn = torch.where(mask.bool(), 0, -1)
    traj = Trajectory({}, mask, turn, owner=torch.arange(n))
    return Sample(traj, [traj], [list(range(n))], mask, max_len=width)


def test_kl_in_the_reward_takes_beta_times_each_answers_summed_kl_off_its_reward():
    cfg = RLConfig(algorithm="grpo", kl_beta=0.5, kl={"estimator": "k1", "placement": "reward"})
    objective = ClippedSurrogate(cfg, None, torch.device("cpu"))
    assert objective.kl_in_reward and objective.needs_old
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ref = torch.zeros(2, 3)
    logp = torch.tensor([[0.5, -0.5, 9.0], [0.25, 9.0, 9.0]])  # 9: off the mask, never counted
    returns = Returns.single_turn(torch.tensor([1.0, 0.0]), group_size=2)
    out = objective.kl_reward(one_turn_sample(mask), Old(logp, torch.zeros(2, 3)), [ref], returns)
    # answer 0: k1 sums to 0.5 - 0.5 = 0; answer 1: 0.25, times beta 0.5
    assert out.turn.flatten().tolist() == pytest.approx([1.0, -0.125])
    assert out.episode.tolist() == pytest.approx([1.0, -0.125])
    assert not ClippedSurrogate(RLConfig(algorithm="grpo", kl_beta=0.0, kl={"placement": "reward"}), None,
                                torch.device("cpu")).kl_in_reward  # no reference, nothing to take off


def test_an_answer_is_cut_when_it_reaches_max_new_tokens_without_its_end_token():
    eos, pad, a, b = 2, 0, 5, 6
    # prompt of 1 token, then: finished early | 4 tokens, no end | end as the 4th token | a teacher's long answer
    seqs = torch.tensor([[9, a, eos, pad, pad], [9, a, b, a, b], [9, a, b, a, eos], [9, a, b, a, b]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    group = Completions(seqs, 1, mask)
    fake = SimpleNamespace(processor=SimpleNamespace(stop_token_ids=[eos]), cfg=RLConfig(max_new_tokens=4))
    lengths, cut = Questions._lengths(fake, group, torch.tensor([False, False, False, True]))
    assert lengths.tolist() == [2, 4, 4, 4]
    assert cut.tolist() == [False, True, False, False]


def params(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text,message", [
    ("rl: {clip_eps_low: 0}", "rl.clip_eps_low"),
    ("rl: {clip_eps_low: 1.0}", "rl.clip_eps_low"),
    ("rl: {clip_eps_high: -0.1}", "rl.clip_eps_high"),
    ("rl: {loss_aggregation: seq_mean}", "rl.loss_aggregation"),
    ("rl: {kl: {estimator: k4}}", "rl.kl.estimator"),
    ("rl: {kl: {placement: advantage}}", "rl.kl.placement"),
    ("rl: {entropy_coef: -0.01}", "rl.entropy_coef"),
    ("rl: {ppo_epochs: 0}", "rl.ppo_epochs"),
    ("rl: {mini_batches: 0}", "rl.mini_batches"),
    ("rl: {questions_per_step: 2, group_size: 2, mini_batches: 5}", "rl.mini_batches (5) must be at most"),
    ("rl: {max_new_tokens: 16, overlong: {penalty_window: 16}}", "rl.overlong.penalty_window (16) must be below"),
    ("rl: {overlong: {penalty: -1}}", "rl.overlong.penalty"),
    ("rl: {overlong: {filter: maybe}}", "rl.overlong.filter"),
    ("rl: {dynamic_sampling: {max_draws: -1}}", "rl.dynamic_sampling.max_draws"),
])
def test_each_setting_is_checked_with_its_name(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_config(params(tmp_path, text + "\n"))
    assert message in str(err.value)


def test_new_settings_at_their_defaults_keep_a_runs_identity():
    """A resume state saved before these settings existed still resumes: at their defaults they are not part of
    the run's fingerprint; set, they are."""
    base = result_params(RLConfig())
    new = {"clip_eps_low", "clip_eps_high", "loss_aggregation", "kl", "entropy_coef", "ppo_epochs", "mini_batches",
           "overlong", "dynamic_sampling"}
    assert not new & set(base)
    dapo = result_params(RLConfig(clip_eps_low=0.2, clip_eps_high=0.28, loss_aggregation="token_mean",
                                  overlong={"penalty_window": 4}, dynamic_sampling={"max_draws": 3}))
    assert {"clip_eps_low", "clip_eps_high", "loss_aggregation", "overlong", "dynamic_sampling"} <= set(dapo)


def test_the_recipes_for_trl_and_verl_users_are_valid_params(tmp_path):
    """docs/coming-from-trl-verl.md's GRPO, Dr.GRPO and DAPO sections load as they are written."""
    import re

    from tests.conftest import REPO

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "coming-from-trl-verl.md").read_text(), re.S)
    assert len(blocks) == 3
    loaded = [load_config(params(tmp_path, block)).rl for block in blocks]
    assert [aggregation_of(c) for c in loaded] == ["seq_mean_token_mean", "dr_grpo", "token_mean"]
    dapo = loaded[2]
    assert (dapo.clip_eps_low, dapo.clip_eps_high, dapo.kl_beta) == (0.2, 0.28, 0.0)
    assert dapo.overlong.penalty_window == 4096 and dapo.dynamic_sampling.max_draws == 10
