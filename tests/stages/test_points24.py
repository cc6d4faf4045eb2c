"""The agent recipes on the Points24 card game (`agent.env: points24`), tiny model: the warm start trains on the
solver's episodes, then PPO with GTR-Turbo's KL to the merged teacher runs on the game, and the thought mask
cuts each output at the game's action."""
import copy
import time

import torch

from protege.config import AgentConfig
from protege.rl.agent_loop import run_agent_rl
from protege.train.agent_sft import train_agent_sft


def points24_cfg():
    return AgentConfig.model_validate({
        "env": "points24", "context": "current",
        "points24": {"cards": 2, "max_turns": 4},
        "sft": {"episodes": 6, "steps": 2, "batch_size": 4},
        "rl": {"algorithm": "ppo", "steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6,
               "save_every": 1, "lr": 1e-3, "ppo": {"epochs": 1, "value_warmup_steps": 0}, "gtr": {"guidance": "kl", "merge": "average"}},
        "eval_episodes": 2})


def test_warm_start_and_rl_run_on_points24(tiny_student, tiny_processor, tmp_path):
    cfg = points24_cfg()
    before = copy.deepcopy(tiny_student.state_dict())
    t0 = time.perf_counter()
    out = train_agent_sft(tiny_student, tiny_processor, cfg, 64, seed=0)
    t_sft = time.perf_counter() - t0
    assert out["episodes"] == 6 and out["turns"] == 6 * 4 and out["loss"] > 0  # a op b = : 4 turns each
    assert any(not torch.equal(before[k], v) for k, v in tiny_student.state_dict().items())
    logs = []
    t0 = time.perf_counter()
    saved = run_agent_rl(tiny_student, tiny_processor, cfg, 64, tmp_path / "out", seed=0,
                         on_log=lambda s, m: logs.append(m))
    t_rl = time.perf_counter() - t0
    print(f"points24 tiny run: agent_sft 2 steps {t_sft:.1f} s, agent_rl 2 steps {t_rl:.1f} s")
    assert [p.name for p in saved] == ["step-00001", "step-00002"]
    assert (tmp_path / "out" / "merged-teacher").is_dir() and len(logs) == 2
    for m in logs:
        assert 1 <= m["turns_per_episode"] <= 4 and 0 <= m["format_error_rate"] <= 1 and "kl_merged" in m
    from protege.eval.agent import evaluate_agent

    r = evaluate_agent(tiny_student, tiny_processor, cfg, 64)  # held-out hands, greedy
    assert r["episodes"] == 2 and 0 <= r["success_rate"] <= 1 and 1 <= r["turns_per_episode"] <= 4


def test_thought_mask_stops_at_the_points24_action(tiny_processor):
    from protege.rl.guidance.merged_teacher import thought_mask
    from protege.rollout.episodes import pack
    from protege.rollout.games import action_start_for

    tok, eos = tiny_processor.tokenizer, tiny_processor.eos_token_id
    prompt = tok("What is in the picture?", add_special_tokens=False)["input_ids"]
    out = tok("I see 3 and 4. Plan: 3*4. Action: *", add_special_tokens=False)["input_ids"] + [eos]
    ids = prompt + out
    traj = pack(tiny_processor, [(ids, [0] * len(prompt) + [1] * len(out), [0] * len(ids), [])])
    targets, own = traj.inputs["input_ids"][0, 1:], traj.loss_mask[0].bool()
    cards = thought_mask(traj, tiny_processor, action_start_for(points24_cfg()))[0].bool()
    assert tok.decode(targets[cards].tolist()).strip() == "I see 3 and 4. Plan: 3*4."
    assert "*" in tok.decode(targets[own & ~cards].tolist())
    grid = thought_mask(traj, tiny_processor)[0].bool()  # the grid game's parser sees no action: all thought
    assert int((own & grid).sum()) == len(out) - 1
