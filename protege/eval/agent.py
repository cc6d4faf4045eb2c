"""Success rate of a policy on the agent game's held-out seeds (greedy play), with the policy's entropy."""
from __future__ import annotations

import numpy as np
import torch

from protege.config import AgentConfig
from protege.eval.stats import percentile_ci
from protege.generation.transformers_backend import Sampling
from protege.rl.episodes import batch_to, pack_episodes, per_episode, play, sequence_logprobs
from protege.world.envs import eval_seed, make_env


@torch.no_grad()
def evaluate_agent(model, processor, cfg: AgentConfig, image_size: int, episodes: int | None = None,
                   device: torch.device | None = None, resamples: int = 1000, seed: int = 0) -> dict:
    """Plays `episodes` held-out layouts (eval seeds 0..n-1) greedily. Per episode: success, turns, format
    errors (turns whose output did not parse or moved illegally) and the policy's mean entropy over its own
    tokens; the summary has the success rate with a bootstrap 95% CI over episodes."""
    n = episodes or cfg.eval_episodes
    greedy = Sampling(do_sample=False, max_new_tokens=cfg.rl.max_new_tokens)
    was_training = model.training
    model.eval()
    rows = []
    for lo in range(0, n, cfg.eval_batch):
        seeds = [eval_seed(i) for i in range(lo, min(n, lo + cfg.eval_batch))]
        envs = [make_env(cfg.env, image_size=image_size, **cfg.grid.model_dump()) for _ in seeds]
        eps = play(model, processor, envs, seeds, greedy, device=device, context=cfg.context)
        batch = pack_episodes(processor, eps)
        if device is not None:
            batch = batch_to(batch, device)
        _, entropy = sequence_logprobs(model, batch, with_entropy=True)
        mask = batch.loss_mask.float()
        per_ep = per_episode((entropy * mask).sum(1), mask.sum(1), batch.owner, len(eps)).cpu().tolist()
        for s, e, h in zip(seeds, eps, per_ep):
            rows.append({"seed": s, "success": e.success, "turns": e.turns, "return": e.total_reward,
                         "format_errors": sum(not i.get("legal", True) for i in e.infos), "entropy": h})
    model.train(was_training)
    success = np.array([float(r["success"]) for r in rows])
    reps = np.random.default_rng(seed).choice(success, size=(resamples, len(success))).mean(axis=1)
    turns = sum(r["turns"] for r in rows)
    return {"episodes": len(rows), "success_rate": float(success.mean()),
            "success_ci": list(percentile_ci(reps)),
            "format_error_rate": sum(r["format_errors"] for r in rows) / max(turns, 1),
            "turns_per_episode": turns / len(rows), "entropy": sum(r["entropy"] for r in rows) / len(rows),
            "per_episode": rows}


def summary_markdown(summary: dict) -> str:
    """The agent_rl stage's reports/agent/summary.json as a short table."""
    lines = ["| agent game (held-out layouts) | success % [95% CI] | format errors % of turns | entropy |",
             "|---|---|---|---|"]
    for key, label in (("start", "warm start"), ("end", "last RL checkpoint"), ("merged_teacher", "merged teacher")):
        r = summary.get(key)
        if r:
            lines.append(f"| {label} | {100 * r['success_rate']:.1f} [{100 * r['success_ci'][0]:.1f}, "
                         f"{100 * r['success_ci'][1]:.1f}] | {100 * r['format_error_rate']:.1f} | {r['entropy']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # `python -m protege.eval.agent reports/agent/summary.json` (make demo prints it)
    import json
    import sys
    from pathlib import Path

    print(summary_markdown(json.loads(Path(sys.argv[1]).read_text())), end="")
