"""Micro-batches change memory, not the update: log-probs from chunks of scored positions equal the model's own
logits' log-softmax, and for every loop the gradients of a step split into micro-batches equal the whole
batch's (float tolerance): grpo, dr_grpo and ril in the question loop, ppo, gtpo and grpo in the multi-turn
loop, SFT and discriminator pretraining."""
import copy
import zlib

import pytest
import torch

import protege.models.logprobs as logprobs
from protege.config import AgentConfig, DiscPretrainConfig, RLConfig, SFTConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.rl.agent_loop import run_agent_rl
from protege.rl.loop import RLInputs, run_rl
from protege.rollout.trajectory import (Trajectory, answer_trajectory, logprobs_from_logits, score,
                                       token_logprobs)
from protege.runtime.micro import budget_tokens, length_groups, micro_batches
from protege.runtime.updaters import TorchUpdater

ONE_ROW = 1  # a budget below any row's width: one row per micro-batch


@pytest.fixture
def step_grads(monkeypatch):
    """The gradients each optimizer step applies, in order (every updater of the run)."""
    seen = []
    original = TorchUpdater.step

    def step(self):
        seen.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.params])
        return original(self)

    monkeypatch.setattr(TorchUpdater, "step", step)
    return seen


def assert_same_grads(whole, micro, steps=None):
    assert len(whole) == len(micro) and whole
    for a, b in list(zip(whole, micro))[:steps]:
        assert len(a) == len(b)
        scale = max(float(g.abs().max()) for g in a)
        assert scale > 0  # a step that trains something
        for ga, gb in zip(a, b):
            torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-5 * scale)


def test_budget_splits_rows_and_keeps_at_least_one():
    assert micro_batches(5, 10, 25) == [range(0, 2), range(2, 4), range(4, 5)]
    assert micro_batches(5, 10, 1000) == [range(0, 5)]
    assert micro_batches(3, 10, 1) == [range(0, 1), range(1, 2), range(2, 3)]


def test_length_groups_cut_where_padding_saved_beats_a_forward():
    # sorted: 10 10 10 50 50 (rows 1 3 4 0 2). One group pads all five to 50 = 250 (+ overhead); two groups
    # cost 3*10 + 2*50 = 130 (+ two overheads)
    lengths = [50, 10, 50, 10, 10]
    assert length_groups(lengths, 1000, overhead=1) == [[1, 3, 4], [0, 2]]  # rows of one length stay together
    assert length_groups(lengths, 1000, overhead=100) == [[1, 3, 4], [0, 2]]  # 130 + 200 < 250 + 100
    assert length_groups(lengths, 1000, overhead=150) == [[1, 3, 4, 0, 2]]  # 130 + 300 > 250 + 150
    # the token budget still binds: at most 100 padded tokens, so the 50s go one per forward
    assert length_groups(lengths, 100, overhead=10**6) == [[1, 3, 4], [0, 2]]
    assert length_groups(lengths, 60, overhead=10**6) == [[1, 3, 4], [0], [2]]
    assert length_groups([7], 1) == [[0]] and length_groups([], 10) == []
    # every row exactly once, whatever the sizes
    many = [(i * 37) % 101 + 1 for i in range(600)]  # above the exact search's size: filled in length order
    for ls, budget in ((many, 2000), (many[:100], 500)):
        groups = length_groups(ls, budget)
        assert sorted(i for g in groups for i in g) == list(range(len(ls)))
        assert all(len(g) == 1 or len(g) * max(ls[i] for i in g) <= budget for g in groups)


def test_trimmed_rows_score_as_the_padded_batch(tiny_student, tiny_processor, tiny_world):
    """A micro-batch of the short rows, cut to its own width, gives each scored token the log-prob it has in
    the whole padded batch: right padding (SFT pairs) and left padding before the scored positions."""
    rows = load_rows(tiny_world / "train.parquet")[:6]
    images = tiny_processor.image_lists([r.image for r in rows])
    targets = [r.sft_target + (" and more words" * 4 if i == 0 else "") for i, r in enumerate(rows)]
    for side in ("right", "left"):
        batch = tiny_processor.encode_pairs([r.question for r in rows], images, targets, padding_side=side)
        traj = answer_trajectory(batch, images)
        if side == "left":  # scored positions start where the first answer does, as a rollout's prompts end
            first = int(traj.loss_mask.any(dim=0).nonzero()[0])
            traj = Trajectory(traj.inputs, traj.loss_mask[:, first:], traj.turn[:, first:], first, traj.owner,
                              images=traj.images)
        whole = token_logprobs(tiny_student, traj)
        short = [1, 2, 3]
        part = traj.select(short, tiny_processor).trimmed(tiny_processor)
        assert part.width < traj.width  # row 0's long answer set the batch's width
        mine = token_logprobs(tiny_student, part)
        keep = traj.loss_mask[short].bool()
        if side == "right":
            want = whole[short][:, :mine.shape[1]]
            assert not bool(traj.loss_mask[short][:, mine.shape[1]:].any())
        else:  # the same tokens, shifted by the columns cut on the left
            want = whole[short][:, -mine.shape[1]:]
        torch.testing.assert_close(mine[part.loss_mask.bool()], want[keep[:, -mine.shape[1]:] if side == "left"
                                                                     else keep[:, :mine.shape[1]]],
                                   rtol=1e-4, atol=1e-5)
        assert int(part.loss_mask.sum()) == int(keep.sum())


def test_derived_budget_keeps_the_demo_whole_and_shrinks_with_the_model(tiny_student):
    tiny = budget_tokens(None, tiny_student)
    assert tiny > 64 * 256  # the demo's RL group (64 rows of ~130 tokens) is one micro-batch
    assert budget_tokens(512, tiny_student) == 512
    from transformers import Qwen2Config
    big = Qwen2Config(hidden_size=3584, num_hidden_layers=28, vocab_size=152064)

    class Seven(torch.nn.Module):
        config = big

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))

    assert budget_tokens(None, Seven()) < tiny / 100


def test_chunked_scores_equal_the_full_log_softmax(tiny_student, tiny_processor, tiny_world, monkeypatch):
    rows = load_rows(tiny_world / "train.parquet")[:5]
    images = tiny_processor.image_lists([r.image for r in rows])
    batch = tiny_processor.encode_pairs([r.question for r in rows], images, [r.sft_target for r in rows])
    traj = answer_trajectory(batch, images)
    vocab = tiny_student.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(logprobs, "LOGIT_CHUNK_BYTES", 4 * vocab * 3)  # three positions per chunk
    mine = score(tiny_student, traj, with_entropy=True)
    logits = tiny_student(**traj.inputs, use_cache=False).logits
    want_logp, want_ent = logprobs_from_logits(logits, traj, with_entropy=True)
    keep = traj.loss_mask.bool()
    torch.testing.assert_close(mine.logp[keep], want_logp[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.entropy[keep], want_ent[keep], rtol=1e-5, atol=1e-5)
    assert float(mine.logp[~keep].abs().sum()) == 0.0
    params = [p for p in tiny_student.parameters() if p.requires_grad]
    assert not mine.entropy.requires_grad  # a metric: no graph keeps each chunk's softmax alive
    got = torch.autograd.grad((mine.logp * keep).sum(), params, allow_unused=True)
    want = torch.autograd.grad((want_logp * keep).sum(), params, allow_unused=True)
    for g, w in zip(got, want):
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * float(w.abs().max().clamp(min=1e-3)))


def test_a_micro_batch_selects_its_rows_vision_inputs(tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "train.parquet")[:4]
    images = tiny_processor.image_lists([r.image for r in rows])
    batch = tiny_processor.encode_pairs([r.question for r in rows], images, [r.sft_target for r in rows])
    traj = answer_trajectory(batch, images)
    part = traj.select(range(2, 4), tiny_processor)
    alone = tiny_processor.encode_pairs([r.question for r in rows[2:]], images[2:], [r.sft_target for r in rows[2:]])
    assert torch.equal(part.inputs["pixel_values"], alone["pixel_values"])
    assert torch.equal(part.loss_mask, traj.loss_mask[2:]) and part.owner.tolist() == [2, 3]


def variety(questions, references, responses):
    """A reward that differs between an untrained policy's samples: distinct characters / 10."""
    return [len(set(r)) / 10 for r in responses]


BASE = dict(steps=1, questions_per_step=3, group_size=2, max_new_tokens=4, save_every=1, lr=1e-3)


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "ril"])
def test_question_loop_gradients_do_not_depend_on_the_split(tiny_student, tiny_processor, tiny_world, tmp_path,
                                                           step_grads, algorithm):
    rows = load_rows(tiny_world / "rl.parquet")[:6]
    answers = {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}, as counted.")] * 2
               for r in rows}
    torch.manual_seed(1)
    disc = Discriminator(copy.deepcopy(tiny_student.model))
    torch.nn.init.normal_(disc.head.weight, std=0.5)  # a discriminator that already tells answers apart
    runs = []
    for tokens in (None, ONE_ROW):
        step_grads.clear()
        # continuous similarity: a binary threshold at 0.5 could flip on float noise between the two runs
        cfg = RLConfig(**BASE, algorithm=algorithm, micro_batch_tokens=tokens, similarity="continuous")
        logs = []
        run_rl(copy.deepcopy(tiny_student), copy.deepcopy(tiny_student), tiny_processor,
               RLInputs(rows, answers, copy.deepcopy(disc), judge=variety), cfg, tmp_path / str(tokens), seed=0,
               on_log=lambda s, m: logs.append(m))
        runs.append((list(step_grads), logs[-1]))
    (whole, m_whole), (micro, m_micro) = runs
    assert m_whole["micro_batches"] == 1 and m_micro["micro_batches"] > 1
    assert_same_grads(whole, micro)  # ril: the discriminator's step, then the policy's
    assert len(whole) == (2 if algorithm == "ril" else 1)
    for key in ("loss", "kl", "entropy"):
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6)


def agent_cfg(algorithm, guidance="none", tokens=None, objective="token"):
    rl4vlm = objective == "rl4vlm"  # RL4VLM's sampling and objective: no KL term, a ratio at temperature 0.5 here
    return AgentConfig.model_validate({
        "grid": {"max_turns": 2},
        "rl": {"algorithm": algorithm, "steps": 1, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6,
               "save_every": 1, "lr": 1e-3, "kl_beta": 0.0 if rl4vlm else 0.04, "micro_batch_tokens": tokens,
               "temperature": 0.5 if rl4vlm else 1.0, "ppo": {"objective": objective, "value_warmup_steps": 0},
               "gtr": {"guidance": guidance, "merge": "average"}, "schedule": "constant"},
        "eval_episodes": 2})


@pytest.mark.parametrize("algorithm,guidance,objective", [("ppo", "kl", "token"), ("gtpo", "none", "token"),
                                                          ("grpo", "sft", "token"), ("ppo", "kl", "rl4vlm")])
def test_multi_turn_loop_gradients_do_not_depend_on_the_split(tiny_student, tiny_processor, tmp_path, step_grads,
                                                              algorithm, guidance, objective):
    from tests.stages.test_agent_rl import VarietyEnv

    runs = []
    for tokens in (None, ONE_ROW):
        step_grads.clear()
        logs = []
        run_agent_rl(copy.deepcopy(tiny_student), tiny_processor, agent_cfg(algorithm, guidance, tokens, objective), 64,
                     tmp_path / str(tokens), seed=0, on_log=lambda s, m: logs.append(m), new_env=VarietyEnv)
        runs.append((list(step_grads), logs[-1]))
    (whole, m_whole), (micro, m_micro) = runs
    assert m_whole["micro_batches"] == 1 and m_micro["micro_batches"] > 1  # one row (episode or turn) each
    # PPO's later epochs start from weights that already differ by float noise: its first step is the check
    assert_same_grads(whole, micro, steps=1)
    for key in ("entropy", "kl", "loss"):
        if algorithm != "ppo" or key != "loss":  # ppo's logged loss is its last epoch's
            assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6)


def test_sft_and_discriminator_gradients_do_not_depend_on_the_split(tiny_student, tiny_processor, tiny_world,
                                                                   step_grads):
    from protege.train.disc_pretrain import Example, pretrain_discriminator
    from protege.train.sft import train_sft

    def split_and_whole(train):  # the first step's gradients with the whole batch, then one row per forward
        grads = []
        for tokens in (None, ONE_ROW):
            step_grads.clear()
            train(tokens)
            grads.append(list(step_grads))
        return grads

    rows = load_rows(tiny_world / "train.parquet")
    assert_same_grads(*split_and_whole(lambda tokens: train_sft(
        copy.deepcopy(tiny_student), tiny_processor, rows,
        SFTConfig(steps=1, batch_size=6, warmup_steps=0, micro_batch_tokens=tokens), seed=0)))

    examples = [Example(r.id, r.question, r.image, r.answer if i % 2 else f"It is {r.answer}.", float(i % 2))
                for i, r in enumerate(rows[:16])]
    torch.manual_seed(1)
    disc = Discriminator(copy.deepcopy(tiny_student.model))
    torch.nn.init.normal_(disc.head.weight, std=0.5)
    assert_same_grads(*split_and_whole(lambda tokens: pretrain_discriminator(
        copy.deepcopy(disc), tiny_processor, examples,
        DiscPretrainConfig(steps=1, batch_size=6, micro_batch_tokens=tokens), seed=0)))


def test_warm_start_gradients_do_not_depend_on_the_length_groups(tiny_student, tiny_processor, step_grads):
    """The agent warm start on whole episodes (context full: rows of differing length), one forward over the
    padded batch against micro-batches of like length cut to their own width, and one row per forward."""
    from protege.config import AgentConfig
    from protege.train.agent_sft import train_agent_sft

    cfg = lambda tokens: AgentConfig.model_validate({
        "context": "full", "grid": {"max_turns": 4},
        "sft": {"episodes": 8, "steps": 1, "batch_size": 6, "micro_batch_tokens": tokens}})
    grads = []
    for tokens in (None, ONE_ROW):
        step_grads.clear()
        train_agent_sft(copy.deepcopy(tiny_student), tiny_processor, cfg(tokens), 64, seed=0)
        grads.append(list(step_grads))
    assert_same_grads(*grads)


class EngineBeside:
    """A rollout engine (vLLM's interface) that samples with the policy itself but reports every sampled token's
    log-prob as `reported`: a stand-in for a bf16 engine whose distribution differs from the policy's."""

    def __init__(self, policy, reported):
        self.policy, self.reported, self.calls = policy, reported, []

    def sample(self, processor, batch, images, sampling, n=1, prompt_ids=None, row_seeds=None):
        from protege.generation.transformers_backend import sample

        out = sample(self.policy, processor, batch, sampling, n, row_seeds, images)
        out.logprobs = torch.full(out.completion_mask.shape, self.reported)
        return out

    def sleep(self):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake_up")

    def sync_weights(self, model):
        self.calls.append("sync")

    def close(self):
        self.calls.append("close")


@pytest.mark.parametrize("tokens", [None, ONE_ROW])
def test_truncated_importance_sampling_weights_the_engines_tokens(tiny_student, tiny_processor, tiny_world, tmp_path,
                                                                 step_grads, monkeypatch, tokens):
    """An engine that reports log-prob -100 for every sampled token: each weight min(pi_old / pi_engine, cap) is
    the cap, so with no KL term the update's gradient is exactly cap times the uncorrected one; the engine
    sleeps through the update and wakes for the weights after it."""
    import protege.rl.loop as loop

    rows = load_rows(tiny_world / "rl.parquet")[:6]
    engines = []

    def engine(cfg, policy, *args):
        engines.append(EngineBeside(policy, -100.0))
        return engines[-1]

    monkeypatch.setattr(loop, "_rollout_engine", engine)
    grads, logs = [], []
    for correction in ("none", "tis"):
        step_grads.clear()
        cfg = RLConfig(**BASE, algorithm="dr_grpo", kl_beta=0.0, rollout_correction=correction, tis_cap=2.0,
                       micro_batch_tokens=tokens)
        run_rl(copy.deepcopy(tiny_student), None, tiny_processor, RLInputs(rows, judge=variety), cfg,
               tmp_path / correction, seed=0, on_log=lambda s, m: logs.append(m))
        grads.append(list(step_grads))
    [none], [tis] = grads
    for g0, g1 in zip(none, tis):
        torch.testing.assert_close(g1, 2.0 * g0, rtol=1e-5, atol=1e-8)
    assert "tis_weight_mean" not in logs[0] and logs[1]["tis_weight_mean"] == 2.0
    assert logs[1]["tis_capped_fraction"] == 1.0 and logs[1]["rollout_logp_gap"] > 90
    assert engines[-1].calls == ["sleep", "sync", "close"]


class NonFiniteEngine(EngineBeside):
    """An engine whose every other sampled token comes back with a NaN or -inf log-prob, sanitised as
    vllm_backend.completions_from_outputs does (0, marked not finite)."""

    def sample(self, processor, batch, images, sampling, n=1, prompt_ids=None, row_seeds=None):
        out = super().sample(processor, batch, images, sampling, n, prompt_ids, row_seeds)
        finite = torch.ones(out.completion_mask.shape, dtype=torch.bool)
        finite[:, ::2] = False
        out.logprobs = torch.where(finite, out.logprobs, torch.zeros_like(out.logprobs))
        out.logprobs_finite = finite
        self.nonfinite = getattr(self, "nonfinite", 0) + float((~finite & out.completion_mask.bool()).sum())
        return out


def test_non_finite_engine_logprobs_get_no_importance_weight(tiny_student, tiny_processor, tiny_world, tmp_path,
                                                            monkeypatch):
    """The tokens whose engine log-prob was not finite keep weight 1 (no correction) and are counted; the others
    are weighted as usual: the run stays finite."""
    import protege.rl.loop as loop

    rows = load_rows(tiny_world / "rl.parquet")[:6]
    engines = []
    monkeypatch.setattr(loop, "_rollout_engine", lambda cfg, policy, *a: engines.append(NonFiniteEngine(policy, -100.0))
                        or engines[-1])
    logs = []
    cfg = RLConfig(**BASE, algorithm="dr_grpo", kl_beta=0.0, rollout_correction="tis", tis_cap=2.0)
    run_rl(copy.deepcopy(tiny_student), None, tiny_processor, RLInputs(rows, judge=variety), cfg, tmp_path,
           seed=0, on_log=lambda s, m: logs.append(m))
    assert sum(m["rollout_logp_nonfinite"] for m in logs) == engines[0].nonfinite > 0
    assert all(1.0 < m["tis_weight_mean"] <= 2.0 for m in logs)  # the finite ones at the cap, none NaN


def test_weights_reach_the_engine_one_tensor_at_a_time(tiny_student):
    """A LoRA policy's weights for the engine: the merged W + scale * B A of each adapted module, made when its
    turn comes; a plain policy's: its own tensors, not copies."""
    import types

    from protege.models.lora import add_lora, iter_merged_weights, merged_state_dict

    plain = dict(iter_merged_weights(tiny_student))
    assert all(plain[k].data_ptr() == v.data_ptr() for k, v in tiny_student.state_dict().items())
    policy = add_lora(copy.deepcopy(tiny_student), rank=4, alpha=8, dropout=0.0, target_modules="auto")
    for module in policy.modules():  # adapters that moved, so the merge differs from the base weights
        if hasattr(module, "lora_B"):
            for b in module.lora_B.values():
                torch.nn.init.normal_(b.weight, std=0.1)
    stream = iter_merged_weights(policy)
    assert isinstance(stream, types.GeneratorType)
    got, want = dict(stream), merged_state_dict(policy)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert any(not torch.equal(want[k], v) for k, v in tiny_student.state_dict().items() if k in want)


def by_question(questions, references, responses):
    """Alike for every answer of about half the questions (groups dynamic sampling drops), varied for the rest."""
    return [0.0 if zlib.crc32(q.encode()) % 3 == 0 else len(set(r)) / 10 for q, r in zip(questions, responses)]


@pytest.mark.parametrize("settings", [
    {"loss_aggregation": "token_mean"}, {"loss_aggregation": "seq_mean_token_mean"},
    {"loss_aggregation": "seq_mean_token_sum"}, {"loss_aggregation": "dr_grpo"},
    {"ppo_epochs": 2, "mini_batches": 2, "clip_eps_high": 0.28}, {"entropy_coef": 0.01},
    {"kl": {"estimator": "low_var", "placement": "reward"}},
    {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_aggregation": "token_mean", "kl_beta": 0.0,
     "overlong": {"filter": True, "penalty_window": 2}, "dynamic_sampling": {"max_draws": 3}},
], ids=["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo", "epochs_and_mini_batches",
        "entropy", "kl_in_reward", "dapo"])
def test_question_loop_settings_do_not_depend_on_the_split(tiny_student, tiny_processor, tiny_world, tmp_path,
                                                           step_grads, settings):
    """Each aggregation normalises by the whole step's answers and tokens, not a micro-batch's; several
    optimizer steps per batch regroup each mini-batch by length and stay equal step by step. RIL's group:
    its teachers' answers of two lengths beside the student's cut ones, so the aggregations differ."""
    rows = load_rows(tiny_world / "rl.parquet")[:6]
    answers = {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}, as counted.")] * 2
               for r in rows}
    torch.manual_seed(1)
    disc = Discriminator(copy.deepcopy(tiny_student.model))
    torch.nn.init.normal_(disc.head.weight, std=0.5)
    runs = []
    for tokens in (None, ONE_ROW):
        step_grads.clear()
        cfg = RLConfig(**{**BASE, "steps": 2}, algorithm="ril", micro_batch_tokens=tokens, similarity="continuous",
                       **settings)
        logs = []
        run_rl(copy.deepcopy(tiny_student), copy.deepcopy(tiny_student), tiny_processor,
               RLInputs(rows, answers, copy.deepcopy(disc), judge=by_question), cfg, tmp_path / str(tokens), seed=0,
               on_log=lambda s, m: logs.append(m))
        runs.append((list(step_grads), logs))
    (whole, l_whole), (micro, l_micro) = runs
    assert l_whole[-1]["micro_batches"] == 1 and l_micro[-1]["micro_batches"] > 1
    passes = settings.get("ppo_epochs", 1) * settings.get("mini_batches", 1)
    assert len(whole) == 2 * (1 + passes)  # each RL step: the discriminator's, then one per mini-batch per pass
    # the second RL step starts from weights that already differ by float noise (Adam moves a parameter with a
    # gradient near 0 by about lr whatever its sign): the first step's optimizer steps are the check, the
    # second step's figures (a KL in the rewards is 0 until the policy has moved) a looser one
    assert_same_grads(whole, micro, steps=1 + passes)
    for m_whole, m_micro, rel in zip(l_whole, l_micro, (1e-4, 1e-3)):
        for key in ("loss", "kl", "entropy", "clip_fraction", "reward"):
            assert m_micro[key] == pytest.approx(m_whole[key], rel=rel, abs=1e-6)
    if "dynamic_sampling" in settings:
        assert all(m["dynamic_sampling_groups"] == BASE["questions_per_step"] for m in l_whole)
        assert any(m["dynamic_sampling_dropped"] > 0 for m in l_whole)
