"""GTR-Turbo's merged teacher as guidance: the running merge of the policy's checkpoints (merged_teacher.py)
either costs each turn its clamped KL to the teacher over the turn's thought tokens, on that turn's reward
(`kl`, as GTR-Turbo's code: the action's tokens are left out), or writes thoughts for
observations of this step that the policy learns by cross-entropy (`sft`). Either way the updated weights join
the merge after every step, and the last teacher is saved beside the checkpoints.

Two rules of the code hold for a turn whose output does not split into a thought and an action: under `kl` it
pays `kl_unparsed` (100 there) instead of a KL it does not have, and under either mode every turn's return gains
the format reward (+3 well formed, -2 not, there), added after the advantages are estimated.

On several ranks the `sft` term is the one process's: the sft_contexts observations are drawn from the whole
step's episodes (every rank draws the same, so the ranks' random generators stay as one), each rank's teacher
answers the ones it played, and each rank's cross-entropy is divided by every rank's thought tokens over the
ranks, so the averaged gradient is that of the token mean over the whole step (as the policy loss's shares,
objectives/base.py). The step's figures are the whole step's too."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from protege.generation.transformers_backend import Sampling, complete
from protege.models.processor import StudentProcessor
from protege.models.student import save_student
from protege.rollout.episodes import Episode, pack, prompt_batch
from protege.rl.estimators.base import Returns
from protege.rl.guidance.base import Guidance, Step
from protege.rl.losses import format_bonus, merged_kl_penalty, unparsed_kl
from protege.rl.merged_teacher import MergedTeacher, trainable_weights
from protege.rollout.trajectory import Trajectory, join_parts, length_parts, thought_sft_loss, token_logprobs
from protege.runtime.distributed import all_reduce_max, gather_objects, per_rank, sum_over_ranks
from protege.runtime.placement import CPU, visiting
from protege.world.envs import action_start as grid_action_start
from protege.world.envs import no_action

TEACHER_DIR = "merged-teacher"
ActionStart = Callable[[str], int | None]  # where an output's action begins (the game's; None: all thought)


@dataclass
class ThoughtBatch:
    batch: Trajectory
    contexts: int          # observations the merged teacher answered
    parsed: int            # of which with a parseable action (the others teach nothing)


def tokens_before(tok, ids: list[int], cut: int) -> int:
    """How many of `ids` decode to text within the first `cut` characters (the thought before the action)."""
    n = 0
    while n < len(ids) and len(tok.decode(ids[:n + 1])) <= cut:
        n += 1
    return n


def thought_mask(traj: Trajectory, processor: StudentProcessor,
                 action_start: ActionStart = grid_action_start) -> torch.Tensor:
    """[N, L] 1 on the thought tokens of each policy turn in `traj`: the turn's tokens before its action (the
    end-of-turn token excluded), or all of them when the turn has no parseable action (all of it is thought).
    `action_start` is the game's (protege.rollout.games.action_start_for)."""
    tok, stops = processor.tokenizer, set(processor.stop_token_ids)
    targets = traj.inputs["input_ids"][:, traj.start + 1:].cpu()  # [N, L]
    own, turn = traj.loss_mask.bool().cpu(), traj.turn.cpu()
    mask = torch.zeros(own.shape, dtype=torch.float32)
    for r in range(own.shape[0]):
        for j in turn[r][own[r]].unique().tolist():
            pos = (own[r] & (turn[r] == j)).nonzero().flatten()  # the turn's tokens, in order
            ids = targets[r, pos].tolist()
            body = ids[:-1] if ids and ids[-1] in stops else ids
            cut = action_start(tok.decode(body))
            n = len(body) if cut is None else tokens_before(tok, body, cut)
            mask[r, pos[:n]] = 1.0
    return mask.to(traj.loss_mask.device)


def picked_turns(eps: list[Episode], k: int, rng: random.Random,
                 index: list[int] | None = None) -> list[tuple[int, int]]:
    """k (episode, turn) of the whole step drawn by `rng`, and of those the ones in `eps`, in the order drawn.
    `index`: each of `eps`' place in the whole step's batch (Step.episode_index; collective: every rank's
    episodes join one list in the order one process plays them, so every rank draws the same, as one process
    would); None: `eps` is the whole step."""
    index = list(range(len(eps))) if index is None else index
    every = sorted(x for mine in gather_objects([(g, e.turns) for g, e in zip(index, eps)]) for x in mine)
    turns = [(g, j) for g, n in every for j in range(n)]
    local = {g: i for i, g in enumerate(index)}
    return [(local[g], j) for g, j in rng.sample(turns, min(k, len(turns))) if g in local]


def merged_thoughts(teacher, processor: StudentProcessor, eps: list[Episode], k: int, sampling: Sampling,
                    rng: random.Random, device: torch.device,
                    action_start: ActionStart = grid_action_start,
                    picked: list[tuple[int, int]] | None = None) -> ThoughtBatch | None:
    """GTR-Turbo `sft`: the merged teacher writes its own output for k observations of this step's episodes
    (the same contexts the policy answered); the tokens before its action are the targets. `picked`: the
    (episode, turn) to answer, already drawn (picked_turns); None: k drawn from `eps`."""
    picked = picked_turns(eps, k, rng) if picked is None else picked
    if not picked:
        return None
    contexts = [eps[i].prefix(j) for i, j in picked]
    batch = {key: v.to(device) for key, v in prompt_batch(processor, contexts).items()}
    out = complete(teacher, processor, batch, [ims for _, ims in contexts], sampling)
    tok = processor.tokenizer
    rows, parsed = [], 0
    for r, (ids, images) in enumerate(contexts):
        gen = out.sequences[r, out.prompt_len:][out.completion_mask[r].bool()].tolist()
        body = gen[:-1] if gen and gen[-1] in processor.stop_token_ids else gen
        cut = action_start(tok.decode(body))
        n_thought = 0
        if cut is not None:
            parsed += 1
            n_thought = tokens_before(tok, body, cut)
        seq = ids + gen
        rows.append((seq, [0] * len(ids) + [1] * n_thought + [0] * (len(gen) - n_thought), [0] * len(seq), images))
    if not parsed:
        return None
    return ThoughtBatch(pack(processor, rows).to(device), len(contexts), parsed)


def well_formed(eps: list[Episode], episodes: int, turns: int, action_start: ActionStart) -> torch.Tensor:
    """[episodes, turns] bool: the turn's output splits into a thought and an action (GTR-Turbo's code calls it
    valid). A game without an action part (the tool game) has no split to check: there, an output is well
    formed unless the game counted a format error."""
    out = torch.zeros(episodes, turns, dtype=torch.bool)
    for i, e in enumerate(eps):
        for j, text in enumerate(e.texts[:turns]):
            if action_start is no_action:
                out[i, j] = bool(e.infos[j].get("legal", True)) if j < len(e.infos) else True
            else:
                out[i, j] = action_start(text) is not None
    return out


class MergedTeacherGuidance(Guidance):
    """`teacher` is a plain copy of the starting policy (merged_teacher.teacher_copy), made before the policy
    moves to its device; `policy` is the policy after its trainable parameters were chosen; `action_start` is
    the game's (where a thought ends; None: the grid game's)."""

    def __init__(self, teacher: torch.nn.Module, policy: torch.nn.Module, gtr, processor: StudentProcessor,
                 sampling: Sampling, rng: random.Random, device: torch.device,
                 action_start: ActionStart | None = None):
        self.teacher, self.gtr, self.processor, self.sampling, self.rng = teacher, gtr, processor, sampling, rng
        self.action_start = action_start or grid_action_start
        self.offload = device != CPU
        self.merged = MergedTeacher(trainable_weights(policy), gtr.merge, gtr.ema_alpha, gtr.ties_density, gtr.teacher)
        self.parts = {"merged_teacher": self.merged}

    def resumed(self) -> None:
        self.merged.load_into(self.teacher)

    def shape(self, step: Step, returns: Returns) -> Returns:
        # the penalty is measured (and logged) under `sft` too; only `kl` takes it off the rewards: each turn
        # pays for its own thought tokens, before the returns and advantages are computed
        parts, rows = (step.parts, step.part_rows) if step.part_rows else ([step.batch], [slice(None)])
        with torch.no_grad(), visiting(self.teacher, step.device, self.offload):
            logp_m = join_parts([token_logprobs(self.teacher, part).cpu() for part in parts], rows,
                                *step.batch.loss_mask.shape)
        # on the CPU: [N, L] per-token figures, whatever the device
        logp, mask, batch = step.logp.detach().cpu(), step.mask.cpu(), step.batch.to(torch.device("cpu"))
        E, T = returns.turn.shape
        formed = well_formed(step.episodes, E, T, self.action_start)  # [E, T]
        penalty = merged_kl_penalty(logp, logp_m, thought_mask(batch, self.processor, self.action_start), batch.turn, batch.owner,
                                    E, T, self.gtr.kl_clamp).cpu()
        penalty = unparsed_kl(penalty, formed, self.gtr.kl_unparsed) * returns.valid  # [E, T]
        # as GTR-Turbo's code, both guidance modes pay the format reward on the return, after estimation
        after = format_bonus(formed, returns.valid, self.gtr.format_reward, self.gtr.format_penalty)  # [E, T]
        # the step's figures over every rank's tokens and turns (collective), as one process would log them
        kl_sum, tokens, penalty_sum, bonus_sum, turns = sum_over_ranks(
            [float(((logp - logp_m) * mask).sum()), float(mask.sum()), float(penalty.sum()), float(after.sum()),
             float(returns.valid.sum())])
        step.metrics["kl_merged"] = kl_sum / max(tokens, 1.0)
        step.metrics["kl_penalty"] = penalty_sum / max(turns, 1.0)  # per turn
        step.metrics["format_bonus"] = bonus_sum / max(turns, 1.0)
        if self.gtr.guidance == "kl":
            cost = self.gtr.kl_coef * penalty  # [E, T]
            if self.gtr.kl_target == "return":  # after estimation: this turn's advantage and value target only
                after = after - cost
            else:
                returns = replace(returns, turn=returns.turn - cost,
                                  total=None if returns.total is None else returns.total - cost.sum(1))
        return replace(returns, after=after if returns.after is None else returns.after + after)

    def loss(self, step: Step) -> Iterator[torch.Tensor]:
        """Collective on several ranks (every rank calls it, whether or not it has contexts to answer)."""
        if self.gtr.guidance != "sft":
            return
        picked = picked_turns(step.episodes, self.gtr.sft_contexts, self.rng, step.episode_index)
        with visiting(self.teacher, step.device, self.offload):
            thoughts = merged_thoughts(self.teacher, self.processor, step.episodes, self.gtr.sft_contexts,
                                       self.sampling, self.rng, step.device, self.action_start, picked=picked)
        mine = thoughts is not None
        # the token mean over every rank's thought tokens: each rank's share divides by their sum over the ranks
        n_tok = per_rank(float(thoughts.batch.loss_mask.sum()) if mine else 0.0)
        parsed, contexts = sum_over_ranks([thoughts.parsed if mine else 0, len(picked)])
        if not parsed:  # on no rank: nothing to learn this step
            return
        parts = length_parts(thoughts.batch, step.tokens or thoughts.batch.n * thoughts.batch.width,
                             self.processor)[0] if mine else []
        # ZeRO over several ranks: as many forwards and backwards on every rank (each is a collective there), a
        # rank with fewer adds empty ones (agreed before the first share: the caller backpropagates it at once)
        most = int(all_reduce_max(torch.tensor(len(parts)))) if step.agree else len(parts)
        sft = 0.0
        for part in parts:
            share = thought_sft_loss(token_logprobs(step.policy, part), part.loss_mask.float(), tokens=n_tok)
            sft += float(share.detach())
            yield self.gtr.sft_coef * share
        for _ in range(most - len(parts)):
            empty = step.parts[0].select([0], self.processor).trimmed(self.processor)
            yield 0.0 * token_logprobs(step.policy, empty).sum()
        step.metrics.update(sft_loss=sft, teacher_parse_rate=parsed / contexts)

    def after_epoch(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        if self.gtr.merge_every == "epoch":
            self.merged.add(trainable_weights(policy))
            metrics["merge_s"] = metrics.get("merge_s", 0.0) + self.merged.seconds

    def after_update(self, policy: torch.nn.Module, metrics: dict[str, float]) -> None:
        if self.gtr.merge_every == "update":
            self.merged.add(trainable_weights(policy))
            metrics["merge_s"] = self.merged.seconds
        self.merged.end_update()
        self.merged.load_into(self.teacher)
        metrics["merged_checkpoints"] = float(self.merged.count)

    def finish(self, out_dir: Path, processor) -> None:
        save_student(self.teacher, processor, out_dir / TEACHER_DIR)
