"""The question loop with the settings TRL and verl users reach for, on the tiny world: settings that name
today's behaviour change no bit; DAPO's recipe (clip-higher, token_mean, overlong punishment, dynamic sampling)
runs and resumes exactly, as do several updates per batch with an entropy bonus and the KL in the rewards;
overlong filtering, the soft punishment, dynamic sampling and the KL placement do what they say."""
import copy

import pytest
import torch

import protege.rl.objectives.clipped as clipped
from protege.config import RLConfig
from protege.data.rows import load_rows
from protege.models.logprobs import logprobs_from_logits
from protege.rl.loop import RLInputs, run_rl
from protege.rl.rollouts.questions import Questions
from protege.rollout.trajectory import answer_trajectory
from tests.stages.test_micro_batches import by_question
from tests.stages.test_micro_batches import step_grads  # noqa: F401 (a fixture)

BASE = dict(steps=2, questions_per_step=2, group_size=4, max_new_tokens=4, save_every=1, lr=1e-3)
DAPO = dict(algorithm="grpo", clip_eps_low=0.2, clip_eps_high=0.28, loss_aggregation="token_mean", kl_beta=0.0,
            overlong={"filter": False, "penalty_window": 2, "penalty": 1.0}, dynamic_sampling={"max_draws": 4})
UPDATES = dict(algorithm="dr_grpo", ppo_epochs=2, mini_batches=2, entropy_coef=0.01,
               kl={"estimator": "low_var", "placement": "reward"})


@pytest.fixture
def rows(tiny_world):
    return load_rows(tiny_world / "rl.parquet")[:6]


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def run(student, processor, rows, tmp_path, judge=by_question, logs=None, **settings):
    cfg = RLConfig(**{**BASE, **settings})
    ref = copy.deepcopy(student) if cfg.kl_beta > 0 else None  # the stage loads no reference without a KL term
    run_rl(student, ref, processor, RLInputs(rows, judge=judge), cfg, tmp_path, seed=0,
           on_log=None if logs is None else lambda s, m: logs.append(m))
    return weights(student)


@pytest.mark.parametrize("algorithm,named", [("grpo", "seq_mean_token_mean"), ("dr_grpo", "dr_grpo")])
def test_settings_that_name_todays_behaviour_change_no_bit(tiny_student, tiny_processor, rows, tmp_path, algorithm,
                                                           named):
    today = run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path / "a", algorithm=algorithm)
    spelled = run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path / "b", algorithm=algorithm,
                  loss_aggregation=named, clip_eps_low=0.2, clip_eps_high=0.2,
                  kl={"estimator": "k3", "placement": "loss"}, ppo_epochs=1, mini_batches=1, entropy_coef=0.0,
                  overlong={"filter": False, "penalty_window": 0}, dynamic_sampling={"max_draws": 0})
    assert all(torch.equal(today[k], spelled[k]) for k in today)
    assert any(not torch.equal(today[k], v) for k, v in tiny_student.state_dict().items())


def test_dapo_recipe_trains_on_groups_with_something_to_learn(tiny_student, tiny_processor, rows, tmp_path,
                                                              monkeypatch):
    trained = []
    original = Questions.rewards

    def rewards(self, s, sample, old):
        returns = original(self, s, sample, old)
        trained.append(sample.answer.view(-1, self.cfg.group_size))  # the judge's scores of the trained groups
        return returns

    monkeypatch.setattr(Questions, "rewards", rewards)
    logs = []
    after = run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, logs=logs, **{**DAPO, "steps": 3})
    assert len(logs) == 3 and any(not torch.equal(after[k], v) for k, v in tiny_student.state_dict().items())
    for m, groups in zip(logs, trained):
        assert 0.0 <= m["dynamic_sampling_dropped"] < 1.0 and 1 <= m["dynamic_sampling_draws"] <= 4
        assert m["dynamic_sampling_groups"] == len(groups) == BASE["questions_per_step"]
        assert all(len(set(g.tolist())) > 1 for g in groups)  # no group whose answers all scored alike
    assert any(m["dynamic_sampling_dropped"] > 0 for m in logs)
    assert {"truncated_share", "clip_fraction", "kl"} <= set(logs[0]) and logs[0]["kl"] == 0.0


def test_dynamic_sampling_that_keeps_nothing_trains_on_the_first_draw(tiny_student, tiny_processor, rows, tmp_path):
    logs = []
    run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, judge=lambda q, r, t: [1.0] * len(t), logs=logs,
        algorithm="grpo", dynamic_sampling={"max_draws": 3})
    assert [(m["dynamic_sampling_dropped"], m["dynamic_sampling_draws"], m["dynamic_sampling_groups"]) for m in logs] \
        == [(1.0, 3.0, 0.0)] * 2
    assert all(m["micro_batches"] >= 1 and m["samples_per_s"] > 0 for m in logs)


@pytest.mark.parametrize("recipe", [DAPO, UPDATES], ids=["dapo", "epochs_minibatches_entropy_kl_in_reward"])
def test_resume_reaches_bitwise_the_same_weights(tiny_student, tiny_processor, rows, tmp_path, recipe):
    """The question cursor and the generators move further under dynamic sampling, and mini-batches are shuffled
    per pass: a run stopped after step 3 and resumed from step 2's state ends where an unbroken one does."""
    def final(folder, stop_after=None, state=True):
        student = copy.deepcopy(tiny_student)
        cfg = RLConfig(**{**BASE, "steps": 4, "save_every": 2, **recipe})
        run_rl(student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows, judge=by_question), cfg, folder,
               seed=3, state_dir=folder / "state" if state else None, stop_after=stop_after)
        return weights(student)

    reference = final(tmp_path / "a", state=False)
    final(tmp_path / "b", stop_after=3)  # "killed" during step 3: the last state is step 2's
    resumed = final(tmp_path / "b")
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    assert any(not torch.equal(reference[k], v) for k, v in tiny_student.state_dict().items())


def test_overlong_filtering_trains_nothing_on_cut_answers(tiny_student, tiny_processor, rows, tmp_path, step_grads):
    runs = {}
    for on in (False, True):
        step_grads.clear()
        logs = []
        run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path / str(on), logs=logs, steps=1,
            algorithm="dr_grpo", max_new_tokens=2, overlong={"filter": on})
        runs[on] = (logs[0], [g for step in step_grads for g in step])
    assert runs[True][0]["truncated_share"] == 1.0  # the untrained student never ends within 2 tokens
    assert "truncated_share" not in runs[False][0]
    assert any(float(g.abs().max()) > 0 for g in runs[False][1])
    assert all(float(g.abs().max()) == 0 for g in runs[True][1])  # every answer was cut: no loss, no KL
    assert runs[True][0]["response_length"] == runs[False][0]["response_length"] == 2.0


def test_soft_overlong_punishment_lowers_a_cut_answers_reward(tiny_student, tiny_processor, rows, tmp_path):
    logs = []
    run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, logs=logs, algorithm="dr_grpo",
        max_new_tokens=4, overlong={"penalty_window": 2, "penalty": 0.5})
    for m in logs:  # every answer is 4 tokens, at the cap: -0.5 * (4 - (4 - 2)) / 2
        assert m["truncated_share"] == 1.0
        assert m["reward"] == pytest.approx(m["answer_reward_student"] - 0.5, abs=1e-6)


def test_kl_in_the_reward_pays_for_the_policys_drift(tiny_student, tiny_processor, rows, tmp_path):
    logs = []
    run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, logs=logs, algorithm="dr_grpo", kl_beta=0.5,
        kl={"placement": "reward"})
    first, second = logs
    assert first["reward"] == pytest.approx(first["answer_reward_student"], abs=1e-6)  # pi_old is pi_ref at first
    assert second["kl"] > 0 and second["reward"] < second["answer_reward_student"]  # k3 is never negative


def test_several_updates_per_batch_keep_pi_old_from_the_first_pass(tiny_student, tiny_processor, rows, tmp_path,
                                                                    step_grads):
    logs = []
    run(copy.deepcopy(tiny_student), tiny_processor, rows, tmp_path, logs=logs, algorithm="grpo", ppo_epochs=2,
        mini_batches=4, lr=1e-2)
    assert len(step_grads) == 2 * 2 * 4  # RL steps x passes x mini-batches
    assert all(m["clip_fraction"] > 0 for m in logs)  # the last pass's ratios moved away from 1


def test_the_entropy_bonus_is_scored_in_chunks(tiny_student, tiny_processor, tiny_world, monkeypatch):
    rows = load_rows(tiny_world / "train.parquet")[:5]
    images = tiny_processor.image_lists([r.image for r in rows])
    traj = answer_trajectory(tiny_processor.encode_pairs([r.question for r in rows], images,
                                                         [r.sft_target for r in rows]), images)
    vocab = tiny_student.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(clipped, "LOGIT_CHUNK_BYTES", 8 * vocab * 3)  # three positions per chunk
    logp, entropy = clipped.scored_with_entropy(tiny_student, traj)
    logits = tiny_student(**traj.inputs, use_cache=False).logits[:, traj.start:-1]
    want_logp, want_entropy = logprobs_from_logits(logits, traj.inputs["input_ids"][:, traj.start + 1:], True)
    keep = traj.loss_mask.bool()
    torch.testing.assert_close(logp[keep], want_logp[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[keep], want_entropy[keep], rtol=1e-5, atol=1e-5)
    assert float(entropy.detach()[~keep].abs().sum()) == 0.0 and entropy.requires_grad
    params = [p for p in tiny_student.parameters() if p.requires_grad]
    got = torch.autograd.grad((entropy * keep).sum(), params, allow_unused=True)
    want = torch.autograd.grad((want_entropy * keep).sum(), params, allow_unused=True)
    for g, w in zip(got, want):
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * float(w.abs().max().clamp(min=1e-3)))
