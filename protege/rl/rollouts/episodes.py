"""The multi-turn loop's rollout (the visual grid game, the tool-use environment): each step `seeds_per_step`
fresh layouts, each played `group_size` times by the policy (an image observation per turn, or a tool's output
as the next turn); rewards per turn from the environment; the estimator's advantage per (episode, turn) is
carried by that turn's tokens."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from protege.errors import UserFacingError
from protege.generation.row_seeds import row_seed
from protege.rl.estimators import Returns
from protege.rl.gtpo import token_advantages
from protege.rl.guidance.base import Step
from protege.rl.held_out import held_out_point
from protege.rl.objectives.base import Advantage
from protege.rl.rollouts.base import Rollout
from protege.rl.sample import Sample
from protege.rl.thought_stats import thought_metrics
from protege.rollout.episodes import Episode, pack_episodes, play
from protege.rollout.games import env_factory, max_turns, sampling_for
from protege.rollout.trajectory import length_parts
from protege.runtime.distributed import world
from protege.runtime.run import due
from protege.runtime.updaters import even_forwards
from protege.world.envs import EVAL_SEED_OFFSET, train_seed


@dataclass
class EpisodeSample(Sample):
    episodes: list[Episode] = field(default_factory=list)
    turn_rewards: torch.Tensor | None = None   # [E, T] the environment's reward per turn, 0 past the end
    valid: torch.Tensor | None = None          # [E, T] bool, True on the episode's turns


def turn_rewards(eps: list[Episode]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn rewards, right-padded: [E, Tmax] rewards and [E, Tmax] bool, True on the episode's turns."""
    T = max(len(e.rewards) for e in eps)
    rewards = torch.zeros(len(eps), T)
    valid = torch.zeros(len(eps), T, dtype=torch.bool)
    for i, e in enumerate(eps):
        rewards[i, :len(e.rewards)] = torch.tensor(e.rewards)
        valid[i, :len(e.rewards)] = True
    return rewards, valid


def rollout_metrics(eps: list[Episode]) -> dict[str, float]:
    """What the step's sampled episodes did; tool metrics where the game reports tool calls."""
    turns = [i for e in eps for i in e.infos]
    m = {"success_rate": sum(e.success for e in eps) / len(eps),
         "format_error_rate": sum(not i.get("legal", True) for i in turns) / max(len(turns), 1),
         "turns_per_episode": len(turns) / len(eps)}
    if any("tool_call" in i for i in turns):
        calls = sum(bool(i.get("tool_call")) for i in turns)
        m.update(accuracy=m["success_rate"], tool_calls_per_episode=calls / len(eps),
                 runtime_error_rate=sum(any(i.get("runtime_error") for i in e.infos) for e in eps) / len(eps),
                 runtime_errors_per_call=sum(bool(i.get("runtime_error")) for i in turns) / max(calls, 1))
    return m


def whole_batch_index(episodes: int, group_size: int, rank: int, world_size: int) -> list[int]:
    """Where each of this rank's episodes stands in the whole step's batch, as one process plays it (every
    layout's group in the order the layouts were drawn): rank r plays layouts r, r + W, r + 2W, ... (`sample`)."""
    return [((i // group_size) * world_size + rank) * group_size + i % group_size for i in range(episodes)]


class Episodes(Rollout):
    label = "agent RL"
    reads_old = True  # GTR-Turbo's KL compares pi_old's thoughts with the merged teacher's; thought metrics

    def __init__(self, cfg, image_size: int, processor, new_env: Callable[[], object] | None = None):
        rl = cfg.rl
        if rl.seeds_per_step < world()[1]:
            raise UserFacingError(f"seeds_per_step ({rl.seeds_per_step}) must be at least the number of processes "
                                  f"({world()[1]}): each process plays its share of every step's layouts")
        self.cfg, self.rl, self.image_size, self.processor = cfg, rl, image_size, processor
        self.new_env = new_env or env_factory(cfg, image_size)
        self.sampling = sampling_for(cfg, do_sample=True, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                     repetition_penalty=rl.repetition_penalty)
        self.max_len = rl.max_new_tokens * max_turns(cfg)  # Dr.GRPO's constant denominator: the longest episode

    def sample(self, s, step: int) -> EpisodeSample:
        # every rank draws the step's layouts (the same RNG use everywhere) and plays its share: a layout's group
        # stays on one rank
        layouts = [train_seed(s.rng.randrange(EVAL_SEED_OFFSET)) for _ in range(self.rl.seeds_per_step)]
        seeds = [x for x in layouts[s.rank::s.world_size] for _ in range(self.rl.group_size)]
        t0 = time.perf_counter()
        with s.updater.gathered():  # ZeRO-3 partitions the weights: generation needs them whole
            # each episode's draws are keyed by its place in the whole step, so the episodes, and with them the
            # run, are the same on any number of ranks
            keys = [row_seed(s.seed, step, k) for k in whole_batch_index(len(seeds), self.rl.group_size, s.rank,
                                                                         s.world_size)]
            eps = play(s.policy, self.processor, [self.new_env() for _ in seeds], seeds, self.sampling,
                       device=s.device, context=self.cfg.context, row_keys=keys)
        rollout_s = time.perf_counter() - t0
        batch = pack_episodes(self.processor, eps)  # N rows: episodes, or their turns (on the CPU)
        parts, rows = length_parts(batch, s.tokens_per_forward, self.processor,
                                   even_forwards(s.updater))  # episodes differ in length
        rewards, valid = turn_rewards(eps)
        return EpisodeSample(batch, [part.to(s.device) for part in parts], rows,
                             batch.loss_mask.float().to(s.device), self.max_len, rollout_s, shape=tuple(rewards.shape),
                             episodes=eps, turn_rewards=rewards, valid=valid)

    def rewards(self, s, sample: EpisodeSample, old) -> Returns:
        sample.view = Step(s.policy, sample.episodes, sample.batch, old.logp, sample.mask, s.device, sample.metrics,
                           sample.parts, s.tokens_per_forward, sample.rows,
                           episode_index=whole_batch_index(len(sample.episodes), self.rl.group_size, s.rank,
                                                           s.world_size),
                           agree=even_forwards(s.updater))
        return Returns(sample.turn_rewards, sample.valid, self.rl.group_size,
                       total=torch.tensor([e.total_reward for e in sample.episodes]), values=old.values)

    def spread(self, s, sample: EpisodeSample, adv: torch.Tensor) -> Advantage:
        batch = sample.batch
        return Advantage(token_advantages(adv.to(s.device), batch.owner.to(s.device), batch.turn.to(s.device),
                                          sample.mask), adv)

    def curve_due(self, s, step: int) -> bool:
        # logged with its step's figures: no point at step 0; several processes each play a share
        return bool(self.rl.eval_every) and step > 0 and due(step, self.rl.eval_every, self.rl.steps) and (
            s.on_log is not None or s.world_size > 1)

    def curve_point(self, s, step: int) -> dict[str, float]:
        # held-out curve: the policy vs the merged teacher
        return held_out_point(s.policy, s.guidance, self.processor, self.cfg, self.image_size, s.device,
                              s.updater.gathered)

    def metrics(self, s, sample: EpisodeSample, returns, adv, old, totals, seconds) -> dict[str, float]:
        eps = sample.episodes
        return {**rollout_metrics(eps),
                "reward": float(returns.episode.mean()),  # after guidance terms
                "return": float(torch.tensor([e.total_reward for e in eps]).mean()),  # the environment's
                "tokens_per_episode": float(sample.mask.sum()) / len(eps),
                **thought_metrics(eps, sample.batch, old.entropy.cpu(), self.processor)}  # thought collapse
