"""Length-grouped micro-batches in the RL loops and the discriminator: rows of clearly different lengths go to
groups of like length, each cut to its own longest row, and the update's gradient is the one of the whole batch
in one forward (float64 weights: what differs is the order of float sums and the padding's columns).

The loop-level tests in test_micro_batches.py split one row per forward; here the groups hold several rows."""
import contextlib
import copy
from unittest import mock

import pytest
import torch

import protege.runtime.micro as micro
import protege.train.disc_pretrain as disc_pretrain
from protege.config import AgentConfig, DiscPretrainConfig, RLConfig
from protege.data.rows import load_rows
from protege.generation.transformers_backend import Completions
from protege.models.discriminator import Discriminator
from protege.rl.estimators.base import Returns
from protege.rl.guidance.base import QuestionStep
from protege.rl.guidance.discriminator import DiscriminatorSimilarity
from protege.rl.objectives.base import Advantage, UpdateBatch
from protege.rl.objectives.clipped import ClippedSurrogate
from protege.rl.objectives.ppo import PPOWithValueHead
from protege.rl.sample import EngineLogprobs, Sample
from protege.rollout.episodes import pack
from protege.rollout.trajectory import Trajectory, from_completions, length_parts, token_logprobs
from tests.stages.test_micro_batches import step_grads  # noqa: F401 (a fixture)

WHOLE = 10**9  # a budget no batch here reaches: one micro-batch
ANSWER_LENGTHS = [2, 30, 3, 28, 4, 25]  # 3 questions x 2 answers, short and long in turn


def word_ids(processor, n: int, offset: int = 0) -> list[int]:
    """n plain text tokens (no special or image tokens)."""
    ids = processor.tokenizer(" ".join(["red blue square circle three"] * 40), add_special_tokens=False)["input_ids"]
    return ids[offset:offset + n]


def question_layout(processor, world) -> Trajectory:
    """The question loop's rows: prompts with an image, left-padded, then answers of the given lengths,
    right-padded (from_completions, as a rollout packs them)."""
    rows = load_rows(world / "rl.parquet")[:3]
    images = [r.image for r in rows]
    prompts = processor.encode_prompts([r.question for r in rows], images)
    P, A, G = prompts["input_ids"].shape[1], max(ANSWER_LENGTHS) + 1, 2
    answers = torch.full((len(ANSWER_LENGTHS), A), processor.tokenizer.pad_token_id)
    for i, n in enumerate(ANSWER_LENGTHS):
        answers[i, :n] = torch.tensor(word_ids(processor, n, i))
    mask = (torch.arange(A) < torch.tensor(ANSWER_LENGTHS).unsqueeze(1)).long()
    done = Completions(torch.cat([prompts["input_ids"].repeat_interleave(G, 0), answers], 1), P, mask)
    return from_completions(done, processor.repeat_rows(prompts, images, G), processor,
                            torch.zeros(len(ANSWER_LENGTHS), dtype=torch.bool),
                            images=[im for im in images for _ in range(G)])


def episode_layout(processor) -> Trajectory:
    """The multi-turn loop's rows (pack: right-padded from column 0), one turn each, the policy's tokens the
    second half of the row."""
    seqs = []
    for i, n in enumerate([12, 90, 14, 84, 13, 80]):
        ids = word_ids(processor, n, i)
        seqs.append((ids, [0] * (n // 2) + [1] * (n - n // 2), [0] * n, []))
    traj = pack(processor, seqs)
    traj.owner = torch.arange(traj.n)
    return traj


def budget_for_two_groups(traj, processor) -> int:
    """Room for the three longest rows in one forward, not for all six: the groups hold several rows each."""
    with one_forward():
        parts, _ = length_parts(traj, WHOLE, processor)
    return 3 * parts[0].width


@contextlib.contextmanager
def one_forward(on: bool = True):
    """Length groups that never split for padding alone (an overhead per forward no saving beats): the whole
    batch in one forward where the budget allows."""
    plain = micro.length_groups

    def groups(lengths, tokens):
        return plain(lengths, tokens, **({"overhead": WHOLE} if on else {}))

    with mock.patch.object(micro, "length_groups", groups):  # what the loops and the discriminator group with
        yield


def perturbed(model, scale: float, seed: int):
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return out


def update_grads(objective, policy, old_policy, ref, traj, processor, tokens, adv, returns=None, engine=None):
    """One update's gradients (policy, then the objective's own parameters) with `tokens` per forward, and
    pi_old's log-probs over the whole batch."""
    with one_forward(tokens == WHOLE):
        parts, rows = length_parts(traj, tokens, processor)
    sample = Sample(traj, parts, rows, traj.loss_mask.double(), max_len=traj.loss_mask.shape[1], engine=engine,
                    shape=None if returns is None else tuple(returns.turn.shape))
    with torch.no_grad():
        old = objective.score_old(old_policy, sample)
        logp_ref = [token_logprobs(ref, part) for part in parts]
    batch = UpdateBatch.of(sample, old, returns, adv, logp_ref, step=1)
    objective.prepare(batch)
    params = [p for p in policy.parameters() if p.requires_grad] + objective.parameters()
    for p in params:
        p.grad = None
    for i in range(len(parts)):
        share, _ = objective.loss(policy, i, batch)
        share.backward()
    return parts, [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params], old


def assert_same(whole, grouped):
    scale = max(float(g.abs().max()) for g in whole)
    assert scale > 0
    for a, b in zip(whole, grouped):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-9 * scale)


def test_length_groups_are_cut_to_their_longest_row(tiny_processor, tiny_world):
    """Every part of both layouts has no column all of its rows pad, and holds rows of like length; in the
    episode layout its width is its longest row's; per-token tensors go to and from the whole batch's columns."""
    for traj in (question_layout(tiny_processor, tiny_world), episode_layout(tiny_processor)):
        tokens = budget_for_two_groups(traj, tiny_processor)
        parts, rows = length_parts(traj, tokens, tiny_processor)
        assert len(parts) > 1 and max(len(r) for r in rows) > 1
        assert sorted(i for r in rows for i in r) == list(range(traj.n))
        ends = [int(traj.inputs["attention_mask"][i].nonzero().max()) + 1 for i in range(traj.n)]
        for part, r in zip(parts, rows):
            assert part.n * part.width <= tokens
            assert bool(part.inputs["attention_mask"].bool().any(dim=0).all())  # trimmed: no all-padding column
            assert torch.equal(part.loss_mask, traj.loss_mask[r, :part.loss_mask.shape[1]])
            assert not bool(traj.loss_mask[r, part.loss_mask.shape[1]:].any())
        sample = Sample(traj, parts, rows, traj.loss_mask.float(), max_len=1)
        assert torch.equal(sample.whole([sample.take(i, traj.loss_mask) for i in range(len(parts))]), traj.loss_mask)
        # the short answers form one group and the long another; the short ones no longer pay the long ones' width
        assert {tuple(r) for r in rows} == {(0, 2, 4), (1, 3, 5)}
        assert min(p.width for p in parts) + 20 < traj.width
    for part, r in zip(parts, rows):  # the episode layout: right-padded from column 0
        assert part.width == max(ends[i] for i in r)


@pytest.mark.parametrize("layout", ["questions", "episodes"])
def test_clipped_surrogate_gradient_does_not_depend_on_the_length_groups(tiny_student, tiny_processor, tiny_world,
                                                                         layout):
    """GRPO's clipped surrogate + KL (per-token advantages, episodes) and Dr.GRPO's with a rollout engine's
    importance weights (one advantage per answer, questions), against a pi_old and pi_ref that differ from the
    policy so the ratios clip."""
    policy = copy.deepcopy(tiny_student).double()
    old, ref = perturbed(policy, 0.02, 1), perturbed(policy, 0.02, 2)
    traj = question_layout(tiny_processor, tiny_world) if layout == "questions" else episode_layout(tiny_processor)
    g = torch.Generator().manual_seed(0)
    N, L = traj.loss_mask.shape
    if layout == "questions":
        cfg = RLConfig(algorithm="dr_grpo", kl_beta=0.04)
        adv = torch.randn(N, generator=g, dtype=torch.float64)
        engine = EngineLogprobs(-torch.rand(N, L, generator=g) * 3, traj.loss_mask.float(), 2.0, 0.0)
    else:
        cfg = RLConfig(algorithm="grpo", kl_beta=0.04)
        adv, engine = torch.randn(N, L, generator=g, dtype=torch.float64) * traj.loss_mask, None
    runs = []
    for tokens in (WHOLE, budget_for_two_groups(traj, tiny_processor)):
        runs.append(update_grads(ClippedSurrogate(cfg, policy, torch.device("cpu")), policy, old, ref, traj,
                                 tiny_processor, tokens, Advantage(adv, adv), engine=engine))
    (p_whole, whole, old_whole), (p_grouped, grouped, old_grouped) = runs
    assert len(p_whole) == 1 and len(p_grouped) > 1
    torch.testing.assert_close(old_grouped.logp, old_whole.logp, rtol=1e-6, atol=1e-9)
    assert_same(whole, grouped)


def test_ppo_gradient_does_not_depend_on_the_length_groups(tiny_student, tiny_processor):
    """PPO with its value head: pi_old's values per turn gathered from the groups, the clipped value loss."""
    cfg = AgentConfig.model_validate({"rl": {"algorithm": "ppo", "ppo": {"value_warmup_steps": 0}}}).rl
    policy = copy.deepcopy(tiny_student).double()
    old, ref = perturbed(policy, 0.02, 1), perturbed(policy, 0.02, 2)
    traj = episode_layout(tiny_processor)
    g = torch.Generator().manual_seed(0)
    N, L = traj.loss_mask.shape
    adv = torch.randn(N, L, generator=g, dtype=torch.float64) * traj.loss_mask
    returns = Returns(torch.randn(N, 1, generator=g), torch.ones(N, 1, dtype=torch.bool), 2)
    runs = []
    for tokens in (WHOLE, budget_for_two_groups(traj, tiny_processor)):
        torch.manual_seed(0)
        objective = PPOWithValueHead(cfg, policy, torch.device("cpu"))
        torch.nn.init.normal_(objective.head.proj.weight, std=0.1)  # a value that depends on the features
        runs.append(update_grads(objective, policy, old, ref, traj, tiny_processor, tokens,
                                 Advantage(adv, adv.sum(1, keepdim=True)), returns=returns))
    (p_whole, whole, old_whole), (p_grouped, grouped, old_grouped) = runs
    assert len(p_whole) == 1 and len(p_grouped) > 1
    torch.testing.assert_close(old_grouped.values, old_whole.values, rtol=1e-6, atol=1e-9)
    assert_same(whole, grouped)


def answers_of_two_lengths(rows) -> tuple[list[str], list[list[str]]]:
    student = [t for r in rows for t in (r.answer, f"{r.answer} " + "and it is so " * 8)]
    teacher = [[f"The answer is {r.answer}.", f"{r.answer}, " + "as counted one by one " * 6] for r in rows]
    return student, teacher


def test_discriminator_gradient_does_not_depend_on_the_length_groups(tiny_student, tiny_processor, tiny_world,
                                                                     step_grads, monkeypatch):
    """RIL's discriminator update and scores, and discriminator pretraining, on answers of two clearly
    different lengths: one forward against groups of like length, each as wide as its longest answer."""
    torch.manual_seed(1)
    disc = Discriminator(copy.deepcopy(tiny_student.model)).double()
    torch.nn.init.normal_(disc.head.weight, std=0.5)
    widths = []
    forward = Discriminator.forward

    def seen(self, input_ids, attention_mask, **kw):
        if torch.is_grad_enabled():  # the updates' forwards (the scores and the held-out evaluation: none)
            widths.append((input_ids.shape[1], int(attention_mask.sum(dim=1).max()), input_ids.shape[0]))
        return forward(self, input_ids, attention_mask, **kw)

    monkeypatch.setattr(Discriminator, "forward", seen)
    rows = load_rows(tiny_world / "rl.parquet")[:3]
    student, teacher = answers_of_two_lengths(rows)
    tokens = 6 * 140  # room for several answers of either length in one forward, not for all twelve

    def guidance(budget):
        cfg = RLConfig(algorithm="ril", micro_batch_tokens=budget, similarity="continuous", teacher_in_group=False)
        term = DiscriminatorSimilarity(copy.deepcopy(disc), cfg, tiny_processor, torch.device("cpu"))
        step = QuestionStep(rows, student, teacher, torch.zeros(len(student), dtype=torch.bool), {})
        return term.shape(step, Returns.single_turn(torch.zeros(len(student)), 2)).episode

    runs = []
    for budget in (None, tokens):
        step_grads.clear()
        widths.clear()
        with one_forward(budget is None):
            reward = guidance(budget)
        runs.append((list(step_grads), reward, list(widths)))
    (whole, r_whole, w_whole), (grouped, r_grouped, w_grouped) = runs
    assert len(w_whole) == 1 and len(w_grouped) > 1
    assert all(width == longest for width, longest, _ in w_grouped)  # each group as wide as its longest answer
    assert max(n for *_, n in w_grouped) > 1 and min(w for w, *_ in w_grouped) < w_whole[0][0]
    assert len(whole) == len(grouped) == 1  # the discriminator's one update
    assert_same(whole[0], grouped[0])
    torch.testing.assert_close(r_grouped, r_whole, rtol=1e-6, atol=1e-9)

    examples = [disc_pretrain.Example(r.id, r.question, r.image, text, label)
                for r in load_rows(tiny_world / "train.parquet")[:8]
                for text, label in ((r.answer, 1.0), (f"{r.answer} " + "and it is so " * 8, 0.0))]
    grads = []
    for budget in (None, tokens):
        step_grads.clear()
        widths.clear()
        with one_forward(budget is None):
            cfg = DiscPretrainConfig(steps=1, batch_size=len(examples), holdout_fraction=0.1, micro_batch_tokens=budget)
            disc_pretrain.pretrain_discriminator(copy.deepcopy(disc), tiny_processor, examples, cfg, seed=0)
        grads.append(list(step_grads))
        assert all(width == longest for width, longest, _ in widths)
        assert len(widths) == 1 if budget is None else len(widths) > 1 and max(n for *_, n in widths) > 1
    assert_same(grads[0][0], grads[1][0])
