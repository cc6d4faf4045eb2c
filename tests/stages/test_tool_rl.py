"""Tool-integrated RL (GTPO) on the tool environment with a tiny model: the expert episode's layout (tool
output attended to, never trained on; turn boundaries kept), a warm start that writes code and stops at its
closed block, the tool turn appended by the rollout engine, the GTPO loop's metrics and exact resume."""
import copy

import pytest
import torch

from protege.config import ModelConfig, ToolConfig
from protege.models.student import build_student
from protege.rl.agent_loop import run_agent_rl
from protege.rollout.episodes import play
from protege.rollout.games import env_factory, expert_episodes, sampling_for
from protege.tools.sandbox import SandboxUnavailable, isolation_tool
from protege.train.agent_sft import expert_as_episode, train_agent_sft
from protege.world.envs import train_seed

pytestmark = pytest.mark.skipif(isolation_tool() is None, reason="bubblewrap (bwrap) is not installed: the tool "
                                "environment refuses to run model code without isolation")


def tiny_cfg(**rl):
    return ToolConfig.model_validate({
        "task": {"kinds": ["arithmetic"]},
        "sft": {"episodes": 4, "steps": 60, "batch_size": 4, "lr": 5e-3},
        "rl": {"steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 64, "save_every": 1,
               "lr": 1e-3, "algorithm": "grpo", **rl},
        "sandbox": {"timeout_s": 2.0},
        "eval_episodes": 4, "eval_batch": 4})


class MemorisedQuestions:
    """The real tool environment, asked only the warm start's four training questions, so a tiny model's
    samples succeed sometimes and the group advantages are not all zero."""

    def __init__(self, cfg):
        self.env = env_factory(cfg, 64)()

    def reset(self, seed):
        return self.env.reset(train_seed(seed % 4))

    def step(self, text):
        return self.env.step(text)


@pytest.fixture(scope="module")
def warm_start(tiny_processor):
    """A tiny student that has memorised four solver episodes: it writes code blocks and boxed answers."""
    model = build_student(ModelConfig(), tiny_processor, seed=0)
    train_agent_sft(model, tiny_processor, tiny_cfg(), 64, seed=0)
    return model


def test_expert_episode_masks_the_tool_output(tiny_processor):
    turns = expert_episodes(tiny_cfg(), 64, 1)[0]
    assert len(turns) == 2 and turns[1][0].role == "tool"
    ep = expert_as_episode(tiny_processor, turns, "full")
    tok = tiny_processor.tokenizer
    assert [tok.decode(ep.ids[a:b - 1]) for a, b in ep.spans] == [t for _, t in turns]
    assert "```python" in turns[0][1] and "\\boxed{" in turns[1][1]
    # the tool's output lies between the two policy spans: attended to, in turn 1, never in the loss
    (_, end0), (start1, _) = ep.spans
    between = tok.decode(ep.ids[end0:start1])
    assert "tool" in between and turns[1][0].text.strip() in between
    assert sum(ep.loss_mask[end0:start1]) <= 1  # at most the first turn's end-of-turn token
    assert set(ep.turn_of[end0 + 1:start1]) == {1}


def test_warm_start_writes_code_and_gets_a_tool_turn(warm_start, tiny_processor):
    cfg = tiny_cfg()
    seeds = [train_seed(i) for i in range(4)]  # the memorised questions
    new_env = env_factory(cfg, 64)
    eps = play(warm_start, tiny_processor, [new_env() for _ in seeds], seeds, sampling_for(cfg, do_sample=False),
               context="full")
    tok = tiny_processor.tokenizer
    called = [e for e in eps if e.infos[0]["tool_call"]]
    assert called, [e.texts for e in eps]
    for e in called:
        assert e.texts[0].rstrip().endswith("```")  # generation stopped at the closed block
        assert len(e.spans) >= 2 and "<|im_start|>tool" in tok.decode(e.ids)
        (_, end0), (start1, _) = e.spans[:2]
        assert sum(e.loss_mask[end0:start1]) == 0  # the tool output (and the appended end-of-turn) untrained


@pytest.mark.parametrize("algorithm", ["gtpo", "grpo"])
def test_loop_trains_and_logs_tool_metrics(warm_start, tiny_processor, tmp_path, algorithm):
    policy = copy.deepcopy(warm_start)
    before = copy.deepcopy(policy.state_dict())
    logs = []
    cfg = tiny_cfg(algorithm=algorithm, group_size=4, temperature=1.6)  # some samples fail, some succeed
    saved = run_agent_rl(policy, tiny_processor, cfg, 64, tmp_path, seed=0, on_log=lambda s, m: logs.append(m),
                         new_env=lambda: MemorisedQuestions(cfg))
    assert [p.name for p in saved] == ["step-00001", "step-00002"]
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    for key in ("accuracy", "tool_calls_per_episode", "runtime_error_rate", "turns_per_episode", "entropy"):
        assert key in logs[-1], key
    assert ("shaping_reward_mean" in logs[-1]) == (algorithm == "gtpo")
    assert sum(m["accuracy"] for m in logs) > 0 and sum(m["tool_calls_per_episode"] for m in logs) > 0


def test_gtpo_resume_is_exact(warm_start, tiny_processor, tmp_path):
    cfg = tiny_cfg(algorithm="gtpo", steps=3)
    full = copy.deepcopy(warm_start)
    run_agent_rl(full, tiny_processor, cfg, 64, tmp_path / "a", seed=1, state_dir=tmp_path / "a" / "state")
    part = copy.deepcopy(warm_start)
    run_agent_rl(part, tiny_processor, cfg, 64, tmp_path / "b", seed=1, state_dir=tmp_path / "b" / "state",
                 stop_after=1)
    again = copy.deepcopy(warm_start)  # a new process: the warm start's weights, then resume
    run_agent_rl(again, tiny_processor, cfg, 64, tmp_path / "b", seed=1, state_dir=tmp_path / "b" / "state")
    for (n, a), b in zip(full.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), n


def test_tool_config_refuses_a_markov_context():
    with pytest.raises(ValueError, match="context"):
        ToolConfig.model_validate({"context": "current"})


def test_unsafe_flag_is_needed_without_bubblewrap(monkeypatch):
    from protege.rollout import games
    from protege.tools import sandbox

    monkeypatch.setattr(sandbox, "isolation_tool", lambda: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        games.sandbox_for(tiny_cfg())
    assert games.sandbox_for(ToolConfig.model_validate({"sandbox": {"unsafe": True}})) is not None
