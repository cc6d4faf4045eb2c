"""Agent RL with GTR-Turbo on the grid game, tiny model, a few steps: weights change, the merged teacher
is the closed-form average of every checkpoint, resume is exact, the merged teacher's thoughts are masked
to the thought tokens, and the warm start learns from the solver's episodes."""
import copy

import pytest
import torch
from safetensors.torch import load_file

from protege.config import AgentConfig, PPOConfig
from protege.generation.transformers_backend import Completions, completion_mask
from protege.rl.agent_loop import run_agent_rl
from protege.rl.guidance.merged_teacher import merged_thoughts
from protege.rollout.episodes import play
from protege.generation.transformers_backend import Sampling
from protege.train.agent_sft import expert_as_episode, grid_params, train_agent_sft
from protege.world.envs import expert_episode, make_env, train_seed


def tiny_cfg(context="full", **gtr):
    return AgentConfig.model_validate({
        "context": context,
        "grid": {"max_turns": 2},
        "sft": {"episodes": 8, "steps": 2, "batch_size": 4},
        "rl": {"steps": 3, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6, "save_every": 1,
               "lr": 1e-3, "algorithm": "grpo", "schedule": "constant",
               "gtr": {"guidance": "kl", "merge": "average", **gtr}},
        "eval_episodes": 4})


class VarietyEnv:
    """Two turns on a grid picture; reward = distinct characters written / 10, so an untrained policy's
    samples already differ in reward (the grid's own rewards need a policy that can write actions)."""

    def reset(self, seed):
        self.env = make_env("grid", max_turns=2)
        self.obs = self.env.reset(seed)
        self.turn = 0
        return self.obs

    def step(self, text):
        from protege.world.envs import StepResult

        self.turn += 1
        done = self.turn == 2
        return StepResult(None if done else self.obs, len(set(text)) / 10, done,
                          {"legal": bool(text), "success": len(set(text)) > 8})


def weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("context", ["full", "current"])
def test_merged_teacher_is_the_average_of_every_checkpoint(tiny_student, tiny_processor, tmp_path, context):
    from protege.models.student import save_student

    save_student(tiny_student, tiny_processor, tmp_path / "init")
    init = weights(tmp_path / "init")
    logs = []
    saved = run_agent_rl(tiny_student, tiny_processor, tiny_cfg(context), 64, tmp_path / "out", seed=0,
                         on_log=lambda s, m: logs.append(m), new_env=VarietyEnv)
    assert [p.name for p in saved] == ["step-00001", "step-00002", "step-00003"]
    ckpts = [weights(p) for p in saved]
    merged = weights(tmp_path / "out" / "merged-teacher")
    changed = 0
    for name in merged:
        expected = sum(c[name] for c in ckpts) / len(ckpts)
        assert torch.allclose(merged[name], expected, atol=1e-6), name
        changed += not torch.equal(ckpts[-1][name], init[name])
    assert changed > 0
    for key in ("success_rate", "format_error_rate", "entropy", "kl_merged", "merge_s", "turns_per_episode"):
        assert key in logs[-1]
    assert logs[0]["kl_merged"] == pytest.approx(0.0, abs=1e-6)  # M_0 = pi_init = the policy at step 1


@pytest.mark.parametrize("algorithm,micro", [("grpo", None), ("ppo", None), ("ppo", 1)])
def test_resume_is_exact(tiny_processor, tmp_path, algorithm, micro):
    """PPO's value head and its moments are part of the state: a resumed run ends on the same weights, with
    the batch in one forward or one row per micro-batch."""
    from protege.config import ModelConfig
    from protege.models.student import build_student

    base = tiny_cfg(merge="ema" if algorithm == "grpo" else "ties_running")
    cfg = base.model_copy(update={"rl": base.rl.model_copy(update={"algorithm": algorithm,
                                                                   "micro_batch_tokens": micro})})
    full = build_student(ModelConfig(), tiny_processor, seed=0)
    run_agent_rl(full, tiny_processor, cfg, 64, tmp_path / "a", seed=1, state_dir=tmp_path / "a" / "state",
                 new_env=VarietyEnv)
    part = build_student(ModelConfig(), tiny_processor, seed=0)
    run_agent_rl(part, tiny_processor, cfg, 64, tmp_path / "b", seed=1, state_dir=tmp_path / "b" / "state",
                 stop_after=2, new_env=VarietyEnv)
    again = build_student(ModelConfig(), tiny_processor, seed=0)  # a new process: fresh weights, then resume
    run_agent_rl(again, tiny_processor, cfg, 64, tmp_path / "b", seed=1, state_dir=tmp_path / "b" / "state",
                 new_env=VarietyEnv)
    for (n, a), b in zip(full.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), n
    ma, mb = weights(tmp_path / "a" / "merged-teacher"), weights(tmp_path / "b" / "merged-teacher")
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_held_out_curve_and_thought_figures_leave_the_weights_as_they_are(tiny_processor, tmp_path):
    """Every eval_every steps and at the last, the policy and the merged teacher play held-out layouts
    greedily (eval_success, teacher_eval_success); the thought figures are logged every step. Neither moves
    the run: its weights end as a run without the curve's."""
    from protege.config import ModelConfig
    from protege.models.student import build_student

    base = tiny_cfg()
    curve = base.model_copy(update={"rl": base.rl.model_copy(update={"eval_every": 2, "eval_episodes": 2})})
    logs = []
    with_curve = build_student(ModelConfig(), tiny_processor, seed=0)
    run_agent_rl(with_curve, tiny_processor, curve, 64, tmp_path / "a", seed=1, new_env=VarietyEnv,
                 on_log=lambda s, m: logs.append((s, m)))
    plain = build_student(ModelConfig(), tiny_processor, seed=0)
    run_agent_rl(plain, tiny_processor, base, 64, tmp_path / "b", seed=1, new_env=VarietyEnv)
    for (n, a), b in zip(with_curve.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), n
    assert [s for s, m in logs if "eval_success" in m] == [2, 3]  # every 2 steps and the last
    assert all(0 <= m["eval_success"] <= 1 and 0 <= m["teacher_eval_success"] <= 1 for _, m in logs[1:])
    for _, m in logs:
        assert {"thought_tokens", "thought_entropy", "distinct_thoughts_per_state", "thought_self_bleu"} <= set(m)
        assert 0 < m["distinct_thoughts_per_state"] <= 1 and 0 <= m["thought_self_bleu"] <= 1


class ScriptedEngine:
    """A generation engine (the interface vLLM's fills) that always answers one text."""

    def __init__(self, processor, text):
        self.ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"] + [processor.tokenizer.eos_token_id]
        self.eos = processor.tokenizer.eos_token_id

    def sample(self, processor, batch, images, sampling, n=1, row_seeds=None):
        B, P = batch["input_ids"].shape
        comp = torch.tensor([self.ids] * B)
        return Completions(torch.cat([batch["input_ids"], comp], 1), P, completion_mask(comp, self.eos),
                           [processor.tokenizer.decode(self.ids[:-1])] * B)


def test_merged_thoughts_train_on_the_thought_only(tiny_student, tiny_processor):
    import random

    eps = play(tiny_student, tiny_processor, [make_env("grid", max_turns=2) for _ in range(2)], [train_seed(0), train_seed(1)],
               Sampling(do_sample=False, max_new_tokens=4))
    tok = tiny_processor.tokenizer
    teacher = ScriptedEngine(tiny_processor, "I am at row 1, column 2. Action: up")
    out = merged_thoughts(teacher, tiny_processor, eps, 3, Sampling(), random.Random(0), torch.device("cpu"))
    assert out.contexts == 3 and out.parsed == 3
    ids = out.batch.inputs["input_ids"][:, 1:]
    for r in range(3):
        target = tok.decode(ids[r][out.batch.loss_mask[r].bool()])
        # the thought's tokens, up to where the action starts (the tokenizer may keep the space before it)
        assert target.rstrip() == "I am at row 1, column 2." and "Action" not in target
    unparsed = merged_thoughts(ScriptedEngine(tiny_processor, "no action here"), tiny_processor, eps, 2, Sampling(),
                               random.Random(0), torch.device("cpu"))
    assert unparsed is None


def test_expert_episodes_and_warm_start(tiny_student, tiny_processor):
    cfg = tiny_cfg("current")
    turns = expert_episode(grid_params(cfg, 64), train_seed(5))
    ep = expert_as_episode(tiny_processor, turns)
    tok = tiny_processor.tokenizer
    assert [tok.decode(ep.ids[a:b - 1]) for a, b in ep.spans] == [t for _, t in turns]
    current = expert_as_episode(tiny_processor, turns, "current")
    assert [tok.decode(t.ids[a:b - 1]) for t in current.per_turn for a, b in t.spans] == [t for _, t in turns]
    assert len(current.rows()) == len(turns)
    before = copy.deepcopy(tiny_student.state_dict())
    out = train_agent_sft(tiny_student, tiny_processor, cfg, 64, seed=0)
    assert out["episodes"] == 8 and out["loss"] > 0
    assert any(not torch.equal(before[k], v) for k, v in tiny_student.state_dict().items())


def test_summary_table_for_the_demo():
    from protege.eval.agent import summary_markdown

    r = {"success_rate": 0.5, "success_ci": [0.4, 0.6], "format_error_rate": 0.25, "entropy": 0.0812}
    md = summary_markdown({"start": r, "end": {**r, "success_rate": 0.625}})
    assert "| warm start | 50.0 [40.0, 60.0] | 25.0 | 0.081 |" in md and "| last RL checkpoint | 62.5" in md
    assert "merged teacher" not in md and "warm start:" not in md  # no episodes: no paired difference
    # per-episode outcomes: the paired difference, by hand. 4 layouts: start 1,1,0,0 -> end 1,1,1,0: +25 points
    episodes = lambda wins: [{"seed": 100 + i, "success": w} for i, w in enumerate(wins)]
    md = summary_markdown({"start": {**r, "per_episode": episodes([1, 1, 0, 0])},
                           "end": {**r, "per_episode": episodes([1, 1, 1, 0])}})
    assert "last RL checkpoint - warm start: +25.0 points, 95% CI [+0.0, +75.0] (paired by held-out layout, 4)" in md


def test_warm_start_resumes_to_bitwise_the_same_weights(tiny_student, tiny_processor, tmp_path):
    """agent_sft (and tool_sft) save their state every save_every steps: a run stopped after step 2 and run
    again ends with exactly the weights of one that never stopped; other settings start afresh."""
    cfg = AgentConfig.model_validate({"grid": {"max_turns": 2},
                                      "sft": {"episodes": 8, "steps": 4, "batch_size": 4, "save_every": 2}})
    whole, parted = copy.deepcopy(tiny_student), copy.deepcopy(tiny_student)
    train_agent_sft(whole, tiny_processor, cfg, 64, seed=0)
    first = train_agent_sft(parted, tiny_processor, cfg, 64, seed=0, state_dir=tmp_path / "state", stop_after=2)
    assert first["resumed_after_step"] == 0
    again = copy.deepcopy(tiny_student)  # a fresh process: the start weights, then the saved state
    out = train_agent_sft(again, tiny_processor, cfg, 64, seed=0, state_dir=tmp_path / "state")
    assert out["resumed_after_step"] == 2 and "loss" in out
    a, b = whole.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"lr": 1e-2})})
    assert train_agent_sft(copy.deepcopy(tiny_student), tiny_processor, other, 64, seed=0,
                           state_dir=tmp_path / "state")["resumed_after_step"] == 0


def test_a_multi_process_launch_needs_deepspeed_and_a_layout_per_rank(tiny_student, tiny_processor, tmp_path,
                                                                     monkeypatch):
    from protege.errors import UserFacingError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(UserFacingError, match="agent.rl.backend 'torch' trains in one process, but this one was "
                                              "launched as one of 2"):
        run_agent_rl(tiny_student, tiny_processor, tiny_cfg(), 64, tmp_path, seed=0)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(UserFacingError, match=r"seeds_per_step \(2\) must be at least the number of processes \(3\)"):
        run_agent_rl(tiny_student, tiny_processor, tiny_cfg(), 64, tmp_path, seed=0)
    with pytest.raises(UserFacingError, match="the agent and tool warm starts train in one process"):
        train_agent_sft(tiny_student, tiny_processor, tiny_cfg(), 64, seed=0)


def test_thought_mask_covers_each_turns_tokens_before_its_action(tiny_processor):
    """GTR-Turbo's KL is paid on thought tokens only: the action and the end-of-turn token are left out, and a
    turn with no parseable action is all thought."""
    from protege.rollout.episodes import pack
    from protege.rl.guidance.merged_teacher import thought_mask

    tok, eos = tiny_processor.tokenizer, tiny_processor.eos_token_id
    prompt = tok("What is in the picture?", add_special_tokens=False)["input_ids"]
    good = tok("I am at row 1. Action: up", add_special_tokens=False)["input_ids"] + [eos]
    bad = tok("row row row", add_special_tokens=False)["input_ids"] + [eos]
    ids = prompt + good + bad
    traj = pack(tiny_processor, [(ids, [0] * len(prompt) + [1] * (len(good) + len(bad)),
                                  [0] * (len(prompt) + len(good)) + [1] * len(bad), [])])
    mask = thought_mask(traj, tiny_processor)[0].bool()
    targets, own = traj.inputs["input_ids"][0, 1:], traj.loss_mask[0].bool()
    first, second = own & (traj.turn[0] == 0), own & (traj.turn[0] == 1)
    thought = tok.decode(targets[first & mask].tolist())
    assert thought.strip() == "I am at row 1." and not (mask & ~own).any()
    assert "up" in tok.decode(targets[first & ~mask].tolist())
    assert int((second & mask).sum()) == len(bad) - 1


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_cosine_schedule_anneals_the_rate_and_its_step_count_joins_the_fingerprint(tiny_student, tiny_processor,
                                                                                     tmp_path, algorithm):
    from protege.rl.agent_loop import agent_fingerprint

    base = tiny_cfg()
    # PPO takes 2 optimizer steps per RL step here; the rate still anneals over the RL steps
    cosine = base.model_copy(update={"rl": base.rl.model_copy(update={"schedule": "cosine", "steps": 3,
                                                                      "algorithm": algorithm,
                                                                      "ppo": PPOConfig(epochs=2)})})
    logs = []
    run_agent_rl(tiny_student, tiny_processor, cosine, 64, tmp_path / "out", seed=0,
                 on_log=lambda s, m: logs.append(m["lr"]), new_env=VarietyEnv)
    # the rate each step's update ran with is logged after it: 1e-3 * (0.1 + 0.45 * (1 + cos(pi * k / 3)))
    import math
    assert logs == pytest.approx([1e-3 * (0.1 + 0.45 * (1 + math.cos(math.pi * k / 3))) for k in (1, 2, 3)])
    longer = cosine.model_copy(update={"rl": cosine.rl.model_copy(update={"steps": 6})})
    assert agent_fingerprint(cosine, 0) != agent_fingerprint(longer, 0)
    flat = base.model_copy(update={"rl": base.rl.model_copy(update={"steps": 6})})
    assert agent_fingerprint(base, 0) == agent_fingerprint(flat, 0)  # constant: more steps continue the run


def test_ppo_takes_its_epochs_and_learns_values(tiny_student, tiny_processor, tmp_path, monkeypatch):
    from protege.rl import session
    from protege.rl.agent_loop import run_agent_rl as run

    clips = []  # the gradient clip the loop's updater is built with (the real updater, recorded)
    real = session.make_updater
    monkeypatch.setattr(session, "make_updater", lambda *a, **kw: clips.append(kw["clip"]) or real(*a, **kw))

    base = tiny_cfg()
    cfg = base.model_copy(update={"rl": base.rl.model_copy(update={"algorithm": "ppo", "steps": 2,
                                                                   "ppo": PPOConfig(epochs=3)})})
    before = {k: v.clone() for k, v in tiny_student.state_dict().items()}
    logs = []
    run(tiny_student, tiny_processor, cfg, 64, tmp_path / "out", seed=0, on_log=lambda s, m: logs.append(m),
        state_dir=tmp_path / "state", new_env=VarietyEnv)
    assert len(logs) == 2 and all(m["value_loss"] > 0 for m in logs)
    assert clips == [0.01] and all(0 < m["grad_norm"] < float("inf") for m in logs)  # RL4VLM's max_grad_norm
    assert any(not torch.equal(v, before[k]) for k, v in tiny_student.state_dict().items())
    # the value head started at V = 0 and was trained: its saved state is no longer all zeros
    from safetensors.torch import load_file

    head = load_file(str(tmp_path / "state" / "value_head.safetensors"))
    assert any(t.abs().sum() > 0 for t in head.values())


@pytest.mark.parametrize("guidance", ["kl", "sft"])
def test_the_codes_format_rules_shift_each_turns_return(tiny_student, tiny_processor, guidance):
    """GTR-Turbo's code: a turn whose output splits into a thought and an action gains the format reward on its
    return; one that does not pays the format penalty and, under `kl`, kl_unparsed in place of its KL. With the
    teacher equal to the policy the KL of a well-formed turn is 0, so the shifts are the hand-computed ones."""
    import random

    from protege.config import GTRConfig
    from protege.rl.estimators.base import Returns
    from protege.rl.guidance.base import Step
    from protege.rl.guidance.merged_teacher import MergedTeacherGuidance
    from protege.rollout.episodes import pack_episodes
    from protege.rollout.trajectory import token_logprobs

    turns = expert_episode(grid_params(tiny_cfg(), 64), train_seed(5))[:2]
    formed = expert_as_episode(tiny_processor, turns)
    broken = expert_as_episode(tiny_processor, [(turns[0][0], "no action here"), turns[1]])  # turn 0 unparsed
    eps = [formed, broken]
    batch = pack_episodes(tiny_processor, eps)
    with torch.no_grad():
        logp = token_logprobs(tiny_student, batch)
    gtr = GTRConfig(guidance=guidance, kl_coef=0.1, kl_unparsed=100.0, format_reward=0.3, format_penalty=-0.2)
    term = MergedTeacherGuidance(copy.deepcopy(tiny_student), tiny_student, gtr, tiny_processor, Sampling(),
                                 random.Random(0), torch.device("cpu"))
    metrics = {}
    step = Step(tiny_student, eps, batch, logp, batch.loss_mask.float(), torch.device("cpu"), metrics, [batch])
    valid = torch.ones(2, 2, dtype=torch.bool)
    out = term.shape(step, Returns(torch.zeros(2, 2), valid, 2))
    unparsed = -0.2 - (0.1 * 100.0 if guidance == "kl" else 0.0)
    assert torch.allclose(out.after, torch.tensor([[0.3, 0.3], [unparsed, 0.3]]), atol=1e-5)
    assert torch.equal(out.turn, torch.zeros(2, 2))  # the rewards themselves are left as they were
    assert metrics["kl_penalty"] == pytest.approx(100.0 / 4, abs=1e-4)
    assert metrics["format_bonus"] == pytest.approx((3 * 0.3 - 0.2) / 4)
    none = MergedTeacherGuidance(copy.deepcopy(tiny_student), tiny_student, gtr.model_copy(update={"kl_unparsed": None}),
                                 tiny_processor, Sampling(), random.Random(0), torch.device("cpu"))
    kept = none.shape(Step(tiny_student, eps, batch, logp, batch.loss_mask.float(), torch.device("cpu"), {}, [batch]),
                      Returns(torch.zeros(2, 2), valid, 2))
    assert torch.allclose(kept.after, torch.tensor([[0.3, 0.3], [-0.2, 0.3]]), atol=1e-5)  # its own KL: 0


def test_value_warmup_trains_the_head_alone_first(tiny_student, tiny_processor, tmp_path):
    """ppo.value_warmup_steps: during the warm-up the policy's weights stay bitwise as they were while the value
    head learns; after it the policy is updated."""
    from safetensors.torch import load_file

    base = tiny_cfg(guidance="none")
    cfg = base.model_copy(update={"rl": base.rl.model_copy(update={
        "algorithm": "ppo", "steps": 2, "ppo": PPOConfig(epochs=2, value_warmup_steps=1)})})
    before = {k: v.clone() for k, v in tiny_student.state_dict().items()}
    logs = []
    run_agent_rl(tiny_student, tiny_processor, cfg, 64, tmp_path / "out", seed=0, state_dir=tmp_path / "state",
                 stop_after=1, new_env=VarietyEnv, on_log=lambda s, m: logs.append(m))
    assert all(torch.equal(v, before[k]) for k, v in tiny_student.state_dict().items())
    assert logs[0]["value_loss"] > 0 and logs[0]["clip_fraction"] == 0.0
    head = load_file(str(tmp_path / "state" / "value_head.safetensors"))
    assert any(t.abs().sum() > 0 for t in head.values())
    run_agent_rl(tiny_student, tiny_processor, cfg, 64, tmp_path / "out", seed=0, state_dir=tmp_path / "state",
                 new_env=VarietyEnv)
    assert any(not torch.equal(v, before[k]) for k, v in tiny_student.state_dict().items())
