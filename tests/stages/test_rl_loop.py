"""The RL loop on a tiny student: dr_grpo and ril steps, exact resume, missing teacher answers, NaN stop."""
import copy
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from protege.config import RLConfig
from protege.data.rows import load_rows
from protege.errors import UserFacingError
from protege.models.discriminator import Discriminator
from protege.rl.guidance.base import Guidance
from protege.rl.loop import RLInputs, run_rl
from tests.conftest import REPO

BASE = dict(steps=3, questions_per_step=2, group_size=2, max_new_tokens=4, save_every=2, lr=1e-3)


@pytest.fixture
def rows(tiny_world):
    return load_rows(tiny_world / "rl.parquet")[:6]


def teacher_answers(rows, n=3):
    return {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}.")] * n for r in rows}


def disc_from(student):
    torch.manual_seed(1)
    return Discriminator(copy.deepcopy(student.model))


def test_dr_grpo_updates_only_trainable_groups(tiny_student, tiny_processor, tiny_world, rows, tmp_path):
    from protege.config import SFTConfig
    from protege.train.sft import train_sft

    # a little SFT first, so that some sampled answers are right and the group rewards differ
    train_sft(tiny_student, tiny_processor, load_rows(tiny_world / "train.parquet"),
              SFTConfig(steps=80, batch_size=16, lr=3e-3, warmup_steps=0), seed=0)
    policy, ref = tiny_student, copy.deepcopy(tiny_student)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    logs = []
    saved = run_rl(policy, ref, tiny_processor, RLInputs(rows), RLConfig(**{**BASE, "group_size": 8, "questions_per_step": 4}, algorithm="dr_grpo"), tmp_path,
                   seed=0, on_log=lambda s, m: logs.append(m))
    assert any(m["advantage_std"] > 0 for m in logs)
    assert [p.name for p in saved] == ["step-00002", "step-00003"]
    changed = {k for k, v in policy.state_dict().items() if not torch.equal(v, before[k])}
    assert any("lm_head" in k for k in changed) and any("self_attn" in k for k in changed)
    assert not any(".mlp." in k for k in changed)  # attention+embeddings+head by default
    assert len(logs) == 3 and {"reward", "kl", "clip_fraction", "entropy", "tokens_per_s"} <= set(logs[0])


def test_checkpoints_every_few_saves_states_at_each(tiny_student, tiny_processor, rows, tmp_path):
    """checkpoint_every 2 with save_every 1 over 3 steps: whole checkpoints after steps 2 and 3 (the last), a
    training state after each step."""
    saved = run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows),
                   RLConfig(**{**BASE, "save_every": 1}, checkpoint_every=2, algorithm="dr_grpo"), tmp_path / "out",
                   seed=0, state_dir=tmp_path / "state", stop_after=1)
    assert saved == [] and (tmp_path / "state" / "state.json").exists()  # step 1: a state, no checkpoint
    saved = run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows),
                   RLConfig(**{**BASE, "save_every": 1}, checkpoint_every=2, algorithm="dr_grpo"), tmp_path / "out",
                   seed=0, state_dir=tmp_path / "state")
    assert [p.name for p in saved] == ["step-00002", "step-00003"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("step-")) == [p.name for p in saved]


def test_ril_step_trains_policy_and_discriminator(tiny_student, tiny_processor, rows, tmp_path):
    disc = disc_from(tiny_student)
    head = disc.head.weight.clone()
    logs = []
    cfg = RLConfig(**BASE, algorithm="ril")
    run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows, teacher_answers(rows), disc),
           cfg, tmp_path, seed=0, on_log=lambda s, m: logs.append(m))
    assert not torch.equal(disc.head.weight, head)
    m = logs[-1]
    for key in ("similarity_reward_student", "similarity_reward_teacher", "answer_reward_teacher",
                "disc_accuracy", "disc_auroc", "disc_score_student", "disc_score_teacher"):
        assert key in m
    assert 0.0 <= m["disc_auroc"] <= 1.0
    assert m["answer_reward_teacher"] == 1.0  # the scripted answers here state the reference


@pytest.mark.parametrize("disc_lr, expected", [(None, 1e-3), (2e-5, 2e-5)])
def test_the_discriminator_trains_at_the_policys_rate_unless_told(tiny_student, tiny_processor, disc_lr, expected):
    # RIL trains the student and the discriminator at one static rate; BASE's policy rate is 1e-3
    from protege.rl.guidance.discriminator import DiscriminatorSimilarity

    cfg = RLConfig(**BASE, algorithm="ril", disc_lr=disc_lr)
    guidance = DiscriminatorSimilarity(disc_from(tiny_student), cfg, tiny_processor, torch.device("cpu"))
    assert [g["lr"] for g in guidance.updater.optimizer.param_groups] == [expected]


def test_an_estimator_is_chosen_by_name(tiny_student, tiny_processor, rows, tmp_path):
    # RIL's group of 2G = 4 answers: RLOO's advantage is G'/(G'-1) = 4/3 times Dr.GRPO's on the same first step
    stds = {}
    for name in ("dr_grpo", "rloo"):
        logs = []
        run_rl(copy.deepcopy(tiny_student), copy.deepcopy(tiny_student), tiny_processor,
               RLInputs(rows, teacher_answers(rows), disc_from(tiny_student)),
               RLConfig(**{**BASE, "steps": 1}, algorithm="ril", advantage=name), tmp_path / name, seed=0,
               on_log=lambda s, m: logs.append(m))
        stds[name] = logs[0]["advantage_std"]
    assert stds["dr_grpo"] > 0
    assert stds["rloo"] == pytest.approx(stds["dr_grpo"] * 4 / 3, rel=1e-5)


def test_fixed_discriminator_and_no_teachers_in_group(tiny_student, tiny_processor, rows, tmp_path):
    disc = disc_from(tiny_student)
    before = copy.deepcopy(disc.state_dict())
    logs = []
    cfg = RLConfig(**BASE, algorithm="ril", discriminator="fixed", teacher_in_group=False, similarity="levels:3")
    run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows, teacher_answers(rows), disc),
           cfg, tmp_path, seed=0, on_log=lambda s, m: logs.append(m))
    assert all(torch.equal(v, before[k]) for k, v in disc.state_dict().items())
    assert "similarity_reward_teacher" not in logs[-1]


def final_weights(student, processor, rows, disc, tmp_path, stop_after=None, state=True, micro=None):
    cfg = RLConfig(**{**BASE, "steps": 4}, algorithm="ril", micro_batch_tokens=micro)
    run_rl(student, copy.deepcopy(student), processor, RLInputs(rows, teacher_answers(rows), disc), cfg, tmp_path,
           seed=3, state_dir=tmp_path / "state" if state else None, stop_after=stop_after)
    return {k: v.clone() for k, v in student.state_dict().items()}


@pytest.mark.parametrize("micro", [None, 1])  # the whole group in one forward, or one row per micro-batch
def test_resume_reaches_bitwise_the_same_weights(tiny_student, tiny_processor, rows, tmp_path, micro):
    reference = final_weights(copy.deepcopy(tiny_student), tiny_processor, rows, disc_from(tiny_student),
                              tmp_path / "a", state=False, micro=micro)
    # "killed" during step 3: the last state is step 2's; a fresh process re-runs from the SFT weights
    final_weights(copy.deepcopy(tiny_student), tiny_processor, rows, disc_from(tiny_student), tmp_path / "b",
                  stop_after=3, micro=micro)
    resumed = final_weights(copy.deepcopy(tiny_student), tiny_processor, rows, disc_from(tiny_student),
                            tmp_path / "b", micro=micro)
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    assert any(not torch.equal(reference[k], v) for k, v in tiny_student.state_dict().items())


def test_questions_without_teacher_answers(tiny_student, tiny_processor, rows, tmp_path):
    answers = teacher_answers(rows[:5])
    logs = []
    cfg = RLConfig(**{**BASE, "steps": 1}, algorithm="ril", max_missing_fraction=0.2)
    run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor,
           RLInputs(rows, answers, disc_from(tiny_student)), cfg, tmp_path, seed=0, on_log=lambda s, m: logs.append(m))
    assert logs[0]["skipped_questions"] == 1
    with pytest.raises(UserFacingError, match="3 of 6 questions have no cached answer"):
        run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor,
               RLInputs(rows, teacher_answers(rows[:3]), disc_from(tiny_student)), cfg, tmp_path, seed=0)


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tiny_student, tiny_processor, rows, tmp_path):
    ref = copy.deepcopy(tiny_student)
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        if calls["n"] >= 2:
            output.logits.fill_(float("nan"))
        return output

    ref.register_forward_hook(poison)
    cfg = RLConfig(**{**BASE, "save_every": 1}, algorithm="dr_grpo")
    with pytest.raises(FloatingPointError, match="at step 2; last good checkpoint: .*step-00001"):
        run_rl(tiny_student, ref, tiny_processor, RLInputs(rows), cfg, tmp_path, seed=0)
    assert (tmp_path / "step-00001" / "model.safetensors").exists() and not (tmp_path / "step-00002").exists()


def test_llm_judge_plugs_into_the_loop(tiny_student, tiny_processor, rows, tmp_path):
    seen = []

    def judge(questions, references, responses):
        seen.append(len(responses))
        return [1.0 if i % 2 else 0.0 for i in range(len(responses))]

    logs = []
    cfg = RLConfig(**{**BASE, "steps": 1}, algorithm="ril")
    run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor,
           RLInputs(rows, teacher_answers(rows), disc_from(tiny_student), judge), cfg, tmp_path, seed=0,
           on_log=lambda s, m: logs.append(m))
    assert seen == [8]  # 2 questions x (2 student + 2 teacher answers)
    assert logs[0]["answer_reward_student"] == 0.5


def _worker(out, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.txt", "a") as log:  # a file, not a pipe: a full pipe would stall the worker
        return subprocess.Popen([sys.executable, "-m", "tests.stages.rl_worker", str(out), *extra], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT)


def _log(out):
    return (out / "log.txt").read_text()[-3000:]


def test_sigkill_then_rerun_reaches_bitwise_the_same_weights(tmp_path):
    from safetensors.torch import load_file

    from protege.runtime.state import read_state

    ref = _worker(tmp_path / "whole")  # uninterrupted, alongside the run that gets killed
    victim = _worker(tmp_path / "killed", "--step-delay", "1.0")
    state = tmp_path / "killed" / "rl" / "state"
    deadline = time.monotonic() + 120
    while victim.poll() is None and time.monotonic() < deadline:
        meta = read_state(state) if state.exists() else None
        if meta is not None and meta["step"] >= 2:
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            shutil.copy(state / "policy.safetensors", tmp_path / "at_kill.safetensors")
            break
        time.sleep(0.05)
    assert victim.wait(timeout=30) == -signal.SIGKILL, _log(tmp_path / "killed")
    assert not (tmp_path / "killed" / "final.safetensors").exists()
    assert ref.wait(timeout=120) == 0, _log(tmp_path / "whole")
    again = _worker(tmp_path / "killed")
    assert again.wait(timeout=120) == 0, _log(tmp_path / "killed")
    a = load_file(str(tmp_path / "whole" / "final.safetensors"))
    b = load_file(str(tmp_path / "killed" / "final.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    # the resumed part really trained: the weights moved between the kill's last state and the end
    at_kill = load_file(str(tmp_path / "at_kill.safetensors"))
    assert any(not torch.equal(at_kill[k], b[k]) for k in b if k in at_kill)

    def names(run):
        return sorted(p.name for p in (tmp_path / run / "rl").glob("step-*"))

    assert names("killed") == names("whole") == [f"step-{i:05d}" for i in range(1, 6)]


def test_offloading_idle_models_changes_nothing(tiny_student, tiny_processor, rows, tmp_path):
    finals = []
    for offload in (True, False):
        policy, disc = copy.deepcopy(tiny_student), disc_from(tiny_student)
        cfg = RLConfig(**{**BASE, "steps": 2}, algorithm="ril", device="cpu", offload_idle=offload)
        run_rl(policy, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows, teacher_answers(rows), disc), cfg,
               tmp_path / str(offload), seed=0)
        finals.append({**policy.state_dict(), **{f"disc.{k}": v for k, v in disc.state_dict().items()}})
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_user_error(tiny_student, tiny_processor, rows, tmp_path):
    with pytest.raises(UserFacingError, match="rl.device is 'cuda'"):
        run_rl(tiny_student, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows),
               RLConfig(**BASE, algorithm="dr_grpo", device="cuda"), tmp_path, seed=0)


def test_learning_curve_changes_no_weight_and_runs_at_its_steps(tiny_student, tiny_processor, tiny_world, rows,
                                                                 tmp_path):
    from protege.eval.accuracy import evaluate_rows

    val = load_rows(tiny_world / "val.parquet")[:4]
    finals, seen = [], []

    def evaluator(step, policy):
        summary, _ = evaluate_rows(policy, tiny_processor, val, batch_size=4, max_new_tokens=4)
        torch.rand(3)  # even a hook that draws random numbers leaves the run's generator where it was
        seen.append((step, summary["accuracy"]))

    for every in (2, 0):
        # ril: the teacher answers in the group make the advantages non-zero, so the weights move
        policy, disc = copy.deepcopy(tiny_student), disc_from(tiny_student)
        cfg = RLConfig(**{**BASE, "steps": 3}, algorithm="ril", eval_every=every)
        run_rl(policy, copy.deepcopy(tiny_student), tiny_processor,
               RLInputs(rows, teacher_answers(rows), disc, evaluator=evaluator), cfg, tmp_path / str(every), seed=0)
        finals.append({**policy.state_dict(), **{f"disc.{k}": v for k, v in disc.state_dict().items()}})
    assert [s for s, _ in seen] == [0, 2, 3]  # step 0, every 2 steps, the last step; none with eval_every 0
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert any(not torch.equal(finals[0][k], v) for k, v in tiny_student.state_dict().items())


def test_more_steps_continue_a_finished_run(tiny_student, tiny_processor, rows, tmp_path):
    """rl.steps 3 -> 5 after a finished run: two more steps, the first three checkpoints kept, and the
    same weights as a 5-step run (the learning rate is constant)."""
    def run(student, steps, out, logs=None):  # RIL: the teachers' answers earn reward, so the weights move
        cfg = RLConfig(**{**BASE, "steps": steps, "save_every": 1}, algorithm="ril")
        run_rl(student, copy.deepcopy(tiny_student), tiny_processor,
               RLInputs(rows, teacher_answers(rows), disc_from(tiny_student)), cfg, out, seed=5,
               state_dir=out / "state", on_log=(lambda s, m: logs.append(s)) if logs is not None else None)
        return {k: v.clone() for k, v in student.state_dict().items()}

    whole = run(copy.deepcopy(tiny_student), 5, tmp_path / "whole")
    short = copy.deepcopy(tiny_student)
    run(short, 3, tmp_path / "grown")
    first = {p.name: (p / "model.safetensors").stat().st_mtime_ns for p in (tmp_path / "grown").glob("step-*")}
    steps_run: list[int] = []
    grown = run(copy.deepcopy(tiny_student), 5, tmp_path / "grown", steps_run)
    assert steps_run == [4, 5]
    assert sorted(p.name for p in (tmp_path / "grown").glob("step-*")) == [f"step-{i:05d}" for i in range(1, 6)]
    assert all((tmp_path / "grown" / n / "model.safetensors").stat().st_mtime_ns == t for n, t in first.items())
    assert all(torch.equal(whole[k], grown[k]) for k in whole)
    assert any(not torch.equal(whole[k], v) for k, v in tiny_student.state_dict().items())


def test_changed_params_keep_the_old_checkpoints_until_the_new_run_has_a_state(tmp_path):
    from protege.runtime.run_folder import STATE, drop_previous, prepare_out_dir, previous_dir

    out = tmp_path / "rl"
    (out / "step-00040").mkdir(parents=True)
    (out / STATE).mkdir()
    (out / STATE / "state.json").write_text('{"step": 40, "fingerprint": "old"}')
    assert prepare_out_dir(out, "old", 60) == 40                     # more steps: continue
    assert prepare_out_dir(out, "new", 60) == 0                      # other params: a fresh run ...
    assert (previous_dir(out) / "step-00040").exists() and not any(out.iterdir())   # ... old run kept aside
    assert prepare_out_dir(out, "new", 60) == 0                      # killed before its first state
    assert (previous_dir(out) / "step-00040").exists()
    assert prepare_out_dir(out, "old", 60) == 40                     # back to the old params: taken back
    assert (out / "step-00040").exists() and not previous_dir(out).exists()
    assert prepare_out_dir(out, "new", 60) == 0
    drop_previous(out)                                               # the new run saved its first state
    assert not previous_dir(out).exists()
    (out / STATE).mkdir()
    (out / STATE / "state.json").write_text('{"step": 60, "fingerprint": "new"}')
    assert prepare_out_dir(out, "new", 40) == 0                      # fewer steps than the state: fresh


def _save_and_die_between_renames(folder, student):
    from protege.runtime import state as checkpoint
    from protege.runtime.state import OptimizerState, Weights
    from protege.runtime.updaters import make_updater

    updater = make_updater("torch", student, list(student.parameters()), 1e-3, 2, torch.device("cpu"))
    parts = {"policy": Weights(updater), "optimizer": OptimizerState(updater)}
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(src)
        if str(src).endswith("state.tmp"):  # the second rename of the swap: killed just before it
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    checkpoint.os.replace = replace
    checkpoint.save_state(folder, step=2, parts=parts, py_rng=random.Random(0), cursor={"order": []},
                          fingerprint="fp")


def test_a_kill_between_the_state_renames_loses_nothing(tiny_student, tmp_path):
    from protege.runtime.state import OptimizerState, Weights, read_state, recover_state, save_state
    from protege.runtime.updaters import make_updater

    folder = tmp_path / "state"
    updater = make_updater("torch", tiny_student, list(tiny_student.parameters()), 1e-3, 2, torch.device("cpu"))
    save_state(folder, step=1, parts={"policy": Weights(updater), "optimizer": OptimizerState(updater)},
               py_rng=random.Random(0), cursor={"order": []}, fingerprint="fp")
    child = multiprocessing.get_context("fork").Process(target=_save_and_die_between_renames,
                                                        args=(folder, tiny_student))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL
    tmp, old = tmp_path / "state.tmp", tmp_path / "state.old"
    assert not folder.exists() and (tmp / "state.json").exists() and (old / "state.json").exists()
    assert read_state(folder)["step"] == 2          # a reader finds the newest complete state, moving nothing
    assert tmp.exists() and old.exists()
    recover_state(folder)                           # the owner finishes the swap
    assert read_state(folder)["step"] == 2 and (folder / "policy.safetensors").exists()
    assert not tmp.exists() and not old.exists()


def test_no_kl_term_needs_no_reference_and_changes_no_weight(tiny_student, tiny_processor, rows, tmp_path):
    """rl.kl_beta 0: the reference forward is skipped (no reference model at all) and the weights are bitwise
    those of a run that had one; a KL term without a reference is refused."""
    # RIL with continuous similarity: rewards differ within every group, so the weights move
    cfg = RLConfig(**{**BASE, "kl_beta": 0.0, "algorithm": "ril", "similarity": "continuous"})
    disc = disc_from(tiny_student)
    with_ref, without = copy.deepcopy(tiny_student), copy.deepcopy(tiny_student)
    run_rl(with_ref, copy.deepcopy(tiny_student), tiny_processor,
           RLInputs(rows, teacher_answers(rows), copy.deepcopy(disc)), cfg, tmp_path / "a", seed=0)
    run_rl(without, None, tiny_processor, RLInputs(rows, teacher_answers(rows), copy.deepcopy(disc)), cfg,
           tmp_path / "b", seed=0)
    a, b = with_ref.state_dict(), without.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], v) for k, v in tiny_student.state_dict().items())
    with pytest.raises(ValueError, match="rl.kl_beta > 0 needs a reference model"):
        run_rl(copy.deepcopy(tiny_student), None, tiny_processor, RLInputs(rows), RLConfig(**BASE, algorithm="dr_grpo"), tmp_path / "c",
               seed=0)


class Recorder(Guidance):
    """A guidance term that writes down which of its hooks its loop calls. Its loss is one share of 1000 on a
    tensor of its own: it reaches no weight, and only the step's logged loss shows it was added."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def resumed(self):
        self.calls.append("resumed")

    def shape(self, step, returns):
        self.calls.append("shape")
        return returns

    def loss(self, step):
        self.calls.append("loss")
        yield torch.tensor(1000.0, requires_grad=True)

    def after_epoch(self, policy, metrics):
        self.calls.append("after_epoch")

    def after_update(self, policy, metrics):
        self.calls.append("after_update")

    def finish(self, out_dir, processor):
        self.calls.append("finish")


@pytest.mark.parametrize("loop,algorithm,epochs", [("question", "dr_grpo", 1), ("agent", "grpo", 1),
                                                   ("agent", "ppo", 2)])
def test_both_loops_call_every_guidance_hook(tiny_student, tiny_processor, rows, tmp_path, monkeypatch, loop,
                                             algorithm, epochs):
    """Two steps, killed after the first and resumed: each step shapes, adds the loss, follows every optimizer
    step and the update; the resumed run says so first and the finished run calls finish once."""
    from protege.config import PPOConfig
    from protege.rl import agent_loop, loop as question_loop
    from tests.stages.test_agent_rl import VarietyEnv, tiny_cfg

    calls, logs = [], []
    module = question_loop if loop == "question" else agent_loop
    own = module.guidance_terms
    monkeypatch.setattr(module, "guidance_terms", lambda *a, **kw: own(*a, **kw) + [Recorder(calls)])
    if loop == "question":
        cfg = RLConfig(**{**BASE, "steps": 2, "save_every": 1}, algorithm=algorithm)
        run = lambda **kw: run_rl(copy.deepcopy(tiny_student), copy.deepcopy(tiny_student), tiny_processor,
                                  RLInputs(rows), cfg, tmp_path / "out", seed=0, state_dir=tmp_path / "state", **kw)
    else:
        base = tiny_cfg(guidance="none")
        cfg = base.model_copy(update={"rl": base.rl.model_copy(update={"algorithm": algorithm, "steps": 2,
                                                                       "ppo": PPOConfig(epochs=epochs)})})
        run = lambda **kw: agent_loop.run_agent_rl(copy.deepcopy(tiny_student), tiny_processor, cfg, 64,
                                                   tmp_path / "out", seed=0, state_dir=tmp_path / "state",
                                                   new_env=VarietyEnv, **kw)
    step = ["shape", "loss"] + ["after_epoch"] * epochs + ["after_update"]
    run(stop_after=1, on_log=lambda s, m: logs.append(m))
    assert calls == step  # stopped early: no finish
    run(on_log=lambda s, m: logs.append(m))
    assert calls == step + ["resumed"] + step + ["finish"]
    if epochs == 1:  # the logged loss is the last epoch's, and the guidance loss joins the first
        assert all(m["loss"] > 999 for m in logs)
