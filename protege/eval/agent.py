"""Success rate (accuracy) of a policy on a multi-turn game's held-out seeds (greedy play), with the policy's
entropy, and for the tool environment its tool calls and runtime errors."""
from __future__ import annotations

import numpy as np
import torch

from protege.eval.stats import paired_bootstrap, percentile_ci
from protege.rollout.episodes import pack_episodes, per_episode, play
from protege.rollout.games import Game, env_factory, is_tool, sampling_for
from protege.rollout.trajectory import token_logprobs
from protege.world.envs import eval_seed


@torch.no_grad()
def evaluate_agent(model, processor, cfg: Game, image_size: int, episodes: int | None = None,
                   device: torch.device | None = None, resamples: int = 1000, seed: int = 0) -> dict:
    """Plays `episodes` held-out layouts (eval seeds 0..n-1) greedily. Per episode: success, turns, format
    errors (turns whose output did not parse or moved illegally), the policy's mean entropy over its own
    tokens and, in the tool game, tool calls and runtime errors; the summary has the success rate with a
    bootstrap 95% CI over episodes."""
    n = episodes or cfg.eval_episodes
    greedy = sampling_for(cfg, do_sample=False)
    new_env = env_factory(cfg, image_size)
    was_training = model.training
    model.eval()
    rows = []
    for lo in range(0, n, cfg.eval_batch):
        seeds = [eval_seed(i) for i in range(lo, min(n, lo + cfg.eval_batch))]
        envs = [new_env() for _ in seeds]
        eps = play(model, processor, envs, seeds, greedy, device=device, context=cfg.context)
        batch = pack_episodes(processor, eps)
        if device is not None:
            batch = batch.to(device)
        _, entropy = token_logprobs(model, batch, with_entropy=True)
        mask = batch.loss_mask.float()
        per_ep = per_episode((entropy * mask).sum(1), mask.sum(1), batch.owner, len(eps)).cpu().tolist()
        for s, e, h in zip(seeds, eps, per_ep):
            rows.append({"seed": s, "success": e.success, "turns": e.turns, "return": e.total_reward,
                         "format_errors": sum(not i.get("legal", True) for i in e.infos), "entropy": h,
                         **({"tool_calls": sum(bool(i.get("tool_call")) for i in e.infos),
                             "runtime_errors": sum(bool(i.get("runtime_error")) for i in e.infos),
                             "kind": e.infos[0].get("kind", "")} if is_tool(cfg) else {})})
    model.train(was_training)
    success = np.array([float(r["success"]) for r in rows])
    reps = np.random.default_rng(seed).choice(success, size=(resamples, len(success))).mean(axis=1)
    turns = sum(r["turns"] for r in rows)
    out = {"episodes": len(rows), "success_rate": float(success.mean()),
           "success_ci": list(percentile_ci(reps)),
           "format_error_rate": sum(r["format_errors"] for r in rows) / max(turns, 1),
           "turns_per_episode": turns / len(rows), "entropy": sum(r["entropy"] for r in rows) / len(rows)}
    if is_tool(cfg):  # runtime-error rate: the share of episodes with at least one failed tool call
        calls = sum(r["tool_calls"] for r in rows)
        out.update(accuracy=out["success_rate"], tool_calls_per_episode=calls / len(rows),
                   runtime_error_rate=sum(r["runtime_errors"] > 0 for r in rows) / len(rows),
                   runtime_errors_per_call=sum(r["runtime_errors"] for r in rows) / max(calls, 1),
                   accuracy_by_kind={k: float(np.mean([r["success"] for r in rows if r["kind"] == k]))
                                     for k in sorted({r["kind"] for r in rows})})
    return {**out, "per_episode": rows}


@torch.no_grad()
def greedy_successes(model, processor, cfg: Game, image_size: int, episodes: int, device: torch.device | None = None,
                     share: tuple[int, int] = (0, 1)) -> tuple[int, int]:
    """(solved, played): greedy plays of held-out layouts (eval seeds 0..episodes-1; with `share` = (rank,
    ranks) every ranks-th of them from rank), `cfg.eval_batch` at a time, with no scoring forward: the cheap
    point of a curve during training."""
    greedy = sampling_for(cfg, do_sample=False)
    new_env = env_factory(cfg, image_size)
    seeds = [eval_seed(i) for i in range(episodes)][share[0]::share[1]]
    was_training = model.training
    model.eval()
    solved = 0
    for lo in range(0, len(seeds), cfg.eval_batch):
        part = seeds[lo:lo + cfg.eval_batch]
        eps = play(model, processor, [new_env() for _ in part], part, greedy, device=device, context=cfg.context)
        solved += sum(e.success for e in eps)
    model.train(was_training)
    return solved, len(seeds)


def summary_markdown(summary: dict) -> str:
    """The agent_rl (or tool_rl) stage's summary.json as a short table."""
    tool = "runtime_error_rate" in summary.get("start", {})
    if tool:
        lines = ["| tool environment (held-out questions) | accuracy % [95% CI] | runtime errors % of episodes "
                 "| tool calls / episode | format errors % of turns |", "|---|---|---|---|---|"]
    else:
        lines = ["| agent game (held-out layouts) | success % [95% CI] | format errors % of turns | entropy |",
                 "|---|---|---|---|"]
    for key, label in (("start", "warm start"), ("end", "last RL checkpoint"), ("merged_teacher", "merged teacher")):
        r = summary.get(key)
        if not r:
            continue
        head = f"| {label} | {100 * r['success_rate']:.1f} [{100 * r['success_ci'][0]:.1f}, {100 * r['success_ci'][1]:.1f}] "
        if tool:
            lines.append(head + f"| {100 * r['runtime_error_rate']:.1f} | {r['tool_calls_per_episode']:.2f} "
                                f"| {100 * r['format_error_rate']:.1f} |")
        else:
            lines.append(head + f"| {100 * r['format_error_rate']:.1f} | {r['entropy']:.3f} |")
    start = summary.get("start") or {}
    for key, label in (("end", "last RL checkpoint"), ("merged_teacher", "merged teacher")):
        after = summary.get(key) or {}
        if "per_episode" in start and "per_episode" in after:
            d = paired_bootstrap({str(e["seed"]): float(e["success"]) for e in start["per_episode"]},
                                 {str(e["seed"]): float(e["success"]) for e in after["per_episode"]})
            lines.append(f"\n{label} - warm start: {d['diff']:+.1f} points, 95% CI [{d['ci'][0]:+.1f}, "
                         f"{d['ci'][1]:+.1f}] (paired by held-out {'question' if tool else 'layout'}, {d['n']})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # `python -m protege.eval.agent reports/agent/summary.json` (make demo prints it)
    import json
    import sys
    from pathlib import Path

    print(summary_markdown(json.loads(Path(sys.argv[1]).read_text())), end="")
