"""The question loop's rollout (grpo, dr_grpo, ril): each step `questions_per_step` questions in an epoch-wise
shuffled order, G samples each from pi_old (the policy, or a vLLM engine serving its weights), for RIL also G
cached teacher answers drawn across the chosen teachers; reward = the judge's correctness, or with rl.rewards the
weighted sum of the functions it names (RIL's discriminator similarity joins it as a guidance term); one
advantage per answer.

DAPO's parts act here: overlong filtering (an answer cut at max_new_tokens trains nothing), the soft overlong
punishment (a reward term over the last tokens before the cap) and dynamic sampling (groups whose answers all
score the same are dropped and more questions drawn, up to `dynamic_sampling.max_draws` draws)."""
from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from protege.data.rows import Row
from protege.errors import UserFacingError
from protege.generation.transformers_backend import Completions, Sampling, complete
from protege.generation.row_seeds import row_seed
from protege.rewards.functions import call, load_rewards, weighted
from protege.rewards.judge import rule_judge
from protege.rl.estimators import Returns
from protege.rl.guidance.base import QuestionStep
from protege.rl.losses import overlong_penalty
from protege.rl.objectives.base import Advantage
from protege.rl.rollouts.base import Rollout
from protege.rl.sample import EngineLogprobs, Sample
from protege.rollout.group import build_group
from protege.rollout.trajectory import from_completions, length_parts
from protege.runtime.distributed import sum_over_ranks, world
from protege.runtime.placement import to_device
from protege.runtime.updaters import even_forwards
from protege.runtime.run import next_rows


@dataclass
class QuestionSample(Sample):
    questions: list[Row] = field(default_factory=list)   # this rank's, in group order
    student: Completions | None = None                     # G per question
    teacher_texts: list[list[str]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)         # every answer of the group, in row order
    per_question: int = 0                                  # G, or 2G with the teachers' answers in the group
    is_teacher: torch.Tensor | None = None                 # [rows] the teachers' answers inside the group
    answer: torch.Tensor | None = None                     # [rows] the judge's score of each answer
    terms: dict[str, torch.Tensor] = field(default_factory=dict)  # rl.rewards: each function's [rows] output
    lengths: torch.Tensor | None = None                    # [rows] answer tokens
    truncated: torch.Tensor | None = None                  # [rows] student answers cut at max_new_tokens unfinished
    student_scores: torch.Tensor | None = None             # [G per question] the judge's, when dynamic sampling judged


@dataclass
class Draw:
    """One draw of questions and this rank's student answers to them."""
    questions: list[Row]
    teacher_texts: list[list[str]]
    images: list
    prompts: dict
    student: Completions
    seconds: float
    scores: torch.Tensor | None = None  # [G per question] the judge's score of each student answer


def teacher_draw(answers: list[tuple[str, str]], cfg, G: int, rng: random.Random) -> list[str]:
    pool = [text for teacher, text in answers if cfg.teachers == "both" or teacher == cfg.teachers]
    if not pool:
        return []
    return rng.sample(pool, G) if len(pool) >= G else [rng.choice(pool) for _ in range(G)]


def eval_due(step: int, cfg) -> bool:
    """Learning-curve points: step 0 (before any update), every eval_every steps, the last step."""
    return cfg.eval_every > 0 and (step % cfg.eval_every == 0 or step == cfg.steps)


def engine_logprobs(student: Completions, is_teacher: torch.Tensor, mask: torch.Tensor, cap: float):
    """The engine's log-prob of each token it sampled (student rows), for its importance weights; a NaN / -inf
    one gets no weight and is counted."""
    logp = torch.zeros(mask.shape)
    logp[~is_teacher, :student.logprobs.shape[1]] = student.logprobs.float().cpu()
    sampled = mask.cpu() * (~is_teacher).float().unsqueeze(1)
    nonfinite = 0.0
    if student.logprobs_finite is not None:
        finite = torch.ones(mask.shape, dtype=torch.bool)
        finite[~is_teacher, :student.logprobs_finite.shape[1]] = student.logprobs_finite.cpu()
        nonfinite = float((sampled * (~finite).float()).sum())
        sampled = sampled * finite.float()
    return EngineLogprobs(logp, sampled, cap, nonfinite)


class Questions(Rollout):
    def __init__(self, cfg, inputs, processor, engine_factory: Callable):
        rank, world_size = world()
        if cfg.questions_per_step < world_size:
            raise UserFacingError(f"rl.questions_per_step ({cfg.questions_per_step}) must be at least the number of "
                                  f"processes ({world_size})")
        self.ril = cfg.algorithm == "ril"
        if self.ril and inputs.discriminator is None:
            raise UserFacingError("rl.algorithm 'ril' needs a pretrained discriminator (run disc_pretrain first)")
        self.cfg, self.inputs, self.processor, self.engine_factory = cfg, inputs, processor, engine_factory
        self.with_teachers = self.ril and cfg.teacher_in_group
        self.terms = load_rewards(cfg.rewards)
        self.rows, self.skipped = self._usable(inputs.rows)
        tok = processor.tokenizer
        longest_teacher = max((len(tok(t, add_special_tokens=False)["input_ids"]) + 1
                               for a in inputs.teacher_answers.values() for _, t in a), default=0)
        self.max_len = max(cfg.max_new_tokens, longest_teacher if self.with_teachers else 0)
        self.sampling = Sampling(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                 repetition_penalty=cfg.repetition_penalty, max_new_tokens=cfg.max_new_tokens)
        self.order: list[int] = []
        self.engine = None
        self.dynamic_figures: dict[str, float] = {}

    def _usable(self, rows: list[Row]) -> tuple[list[Row], int]:
        """RIL: questions with no answer from the chosen teachers cannot form a group (skipped, up to a share)."""
        cfg = self.cfg
        if self.ril:
            usable = [r for r in rows
                      if teacher_draw(self.inputs.teacher_answers.get(r.id, []), cfg, 1, random.Random(0))]
            missing = len(rows) - len(usable)
            if missing and missing / len(rows) > cfg.max_missing_fraction:
                raise UserFacingError(f"{missing} of {len(rows)} questions have no cached answer from teachers="
                                      f"'{cfg.teachers}' (more than rl.max_missing_fraction={cfg.max_missing_fraction})")
            rows = usable
        if not rows:
            raise UserFacingError("no questions to train on")
        return rows, len(self.inputs.rows) - len(rows)

    def start(self, s) -> None:
        self.order = s.cursor.get("order", [])
        self.engine = self.engine_factory(self.cfg, s.policy, self.processor, s.updater, s.seed, s.rank, s.world_size,
                                          s.start, self.inputs.max_prompt_tokens, self.rows)

    def _draw(self, s, step: int, draw: int) -> Draw:
        """The next questions_per_step questions of the order and this rank's G answers to each; `draw` > 0:
        a dynamic-sampling step's later draws."""
        cfg, G, processor = self.cfg, self.cfg.group_size, self.processor
        Q = cfg.questions_per_step
        idx, self.order = next_rows(self.order, len(self.rows), Q, s.rng)
        questions = [self.rows[i] for i in idx]
        # every rank draws for the whole step (same RNG use everywhere), then keeps its share of questions
        teacher_texts = [teacher_draw(self.inputs.teacher_answers.get(r.id, []), cfg, G, s.rng) if self.ril else []
                         for r in questions]
        # each answer's draws are keyed by its question's place in the whole step, so the answers, and with
        # them the run, are the same on any number of ranks
        seeds = [row_seed(s.seed, step, draw * Q + k) for k in range(len(questions))][s.rank::s.world_size]
        questions, teacher_texts = questions[s.rank::s.world_size], teacher_texts[s.rank::s.world_size]
        images = [r.image for r in questions]
        prompts = to_device(processor.encode_prompts([r.question for r in questions], images), s.device)
        t0 = time.perf_counter()
        # the policy samples with its weights whole (a ZeRO-3 gather); an engine holds its own copy of them
        with s.updater.gathered() if self.engine is s.policy else contextlib.nullcontext():
            student = complete(self.engine, processor, prompts, images, self.sampling, G,
                               questions=[r.question for r in questions], row_seeds=seeds)
        return Draw(questions, teacher_texts, images, prompts, student, time.perf_counter() - t0)

    def sample(self, s, step: int) -> QuestionSample:
        cfg, G, processor = self.cfg, self.cfg.group_size, self.processor
        d = self._draw(s, step, 0)
        if cfg.dynamic_sampling.max_draws:
            d = self._dynamic(s, step, d)
        if callable(getattr(self.engine, "sleep", None)):
            self.engine.sleep()  # a vLLM engine's memory goes to the update; taken back before the next rollout
        questions, teacher_texts, images, prompts, student = (d.questions, d.teacher_texts, d.images, d.prompts,
                                                              d.student)
        group, is_teacher, texts = build_group(student, prompts["input_ids"],
                                               teacher_texts if self.with_teachers else [[] for _ in questions],
                                               processor, G)
        per_q = group.sequences.shape[0] // len(questions)
        traj = from_completions(group, processor.repeat_rows(prompts, images, per_q), processor, is_teacher,
                                images=[im for im in images for _ in range(per_q)])
        # answers of like length together, each micro-batch cut to its longest
        parts, rows = length_parts(traj, s.tokens_per_forward, processor, even_forwards(s.updater))
        mask = traj.loss_mask.float()  # [B, L] student and teacher answer tokens
        lengths, truncated = self._lengths(group, is_teacher)
        if cfg.overlong.filter:  # DAPO's overlong filtering: a cut answer's reward says nothing of its tokens
            mask = mask * (~truncated).to(mask.device, mask.dtype).unsqueeze(1)
        engine = (engine_logprobs(student, is_teacher, mask, cfg.tis_cap)
                  if student.logprobs is not None and cfg.rollout_correction == "tis" else None)
        out = QuestionSample(traj, parts, rows, mask, self.max_len, d.seconds, engine=engine,
                             questions=questions, student=student, teacher_texts=teacher_texts, texts=texts,
                             per_question=per_q, is_teacher=is_teacher, lengths=lengths, truncated=truncated,
                             student_scores=d.scores)
        if cfg.overlong.filter or cfg.overlong.penalty_window:
            out.metrics["truncated_share"] = float(truncated.sum()) / max(int((~is_teacher).sum()), 1)
        out.metrics.update(self.dynamic_figures)
        return out

    def _lengths(self, group: Completions, is_teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's answer tokens [rows], and whether it is a student answer that reached max_new_tokens
        without its end-of-turn token [rows] bool (on the CPU)."""
        mask = group.completion_mask.cpu()
        lengths = mask.sum(dim=1)
        completion = group.sequences[:, group.prompt_len:].cpu()
        last = completion.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        finished = torch.isin(last, torch.tensor(self.processor.stop_token_ids))
        return lengths, (lengths >= self.cfg.max_new_tokens) & ~finished & ~is_teacher.cpu()

    def _dynamic(self, s, step: int, first: Draw) -> Draw:
        """DAPO's dynamic sampling: a group whose answers the judge scores all alike has no advantage to learn
        from; it is dropped and more questions drawn until this rank holds its share of questions_per_step
        groups or max_draws draws were made (every rank draws as long as one is short: generation under
        ZeRO-3 is collective). Kept beyond the share: left out, as DAPO does. The groups are judged on their
        student answers (by rl.rewards' weighted sum when set; RIL's similarity, the overlong penalty and the KL
        are not the judge's). None kept at all: the first draw's groups train (under the judge alone their advantages are 0: the KL and entropy
        terms move the policy)."""
        cfg, G = self.cfg, self.cfg.group_size
        share = len(range(s.rank, cfg.questions_per_step, s.world_size))
        draws, kept, dropped, drawn = [first], [], 0, 0
        while True:
            d = draws[-1]
            d.scores = torch.tensor(self._scored([r for r in d.questions for _ in range(G)], d.student.texts,
                                                 [False] * len(d.student.texts))[0], dtype=torch.float32)
            for j in range(len(d.questions)):
                scores = d.scores[j * G:(j + 1) * G]
                drawn += 1
                if bool((scores == scores[0]).all()):
                    dropped += 1
                elif len(kept) < share:
                    kept.append((len(draws) - 1, j))
            short = sum_over_ranks([float(share - len(kept))])[0]
            if short == 0 or len(draws) >= cfg.dynamic_sampling.max_draws:
                break
            draws.append(self._draw(s, step, len(draws)))
        self.dynamic_figures = {"dynamic_sampling_dropped": dropped / max(drawn, 1),
                                "dynamic_sampling_draws": float(len(draws)),
                                "dynamic_sampling_groups": float(len(kept))}
        if not kept:
            kept = [(0, j) for j in range(len(first.questions))]
        return self._merged(s, draws, kept)

    def _merged(self, s, draws: list[Draw], kept: list[tuple[int, int]]) -> Draw:
        """The kept groups of several draws as one: prompts encoded again together (left-padded to the longest),
        answers right-padded to the longest."""
        seconds = sum(d.seconds for d in draws)
        if len(draws) == 1 and kept == [(0, j) for j in range(len(draws[0].questions))]:
            draws[0].seconds = seconds
            return draws[0]
        G, processor = self.cfg.group_size, self.processor
        questions = [draws[d].questions[j] for d, j in kept]
        images = [draws[d].images[j] for d, j in kept]
        prompts = to_device(processor.encode_prompts([r.question for r in questions], images), s.device)
        ids = prompts["input_ids"]
        rows = [(draws[d].student, j * G + g) for d, j in kept for g in range(G)]
        P, L = ids.shape[1], max(c.sequences.shape[1] - c.prompt_len for c, _ in rows)
        seqs = torch.full((len(rows), P + L), processor.pad_token_id, dtype=ids.dtype, device=ids.device)
        mask = torch.zeros(len(rows), L, dtype=rows[0][0].completion_mask.dtype, device=ids.device)
        with_lp = all(c.logprobs is not None for c, _ in rows)
        logprobs = torch.zeros(len(rows), L) if with_lp else None
        with_finite = with_lp and all(c.logprobs_finite is not None for c, _ in rows)
        finite = torch.ones(len(rows), L, dtype=torch.bool) if with_finite else None
        for k, (c, r) in enumerate(rows):
            w = c.sequences.shape[1] - c.prompt_len
            seqs[k, :P] = ids[k // G]
            seqs[k, P:P + w] = c.sequences[r, c.prompt_len:].to(ids.device)
            mask[k, :w] = c.completion_mask[r].to(ids.device)
            if with_lp:
                logprobs[k, :c.logprobs.shape[1]] = c.logprobs[r].float().cpu()
            if with_finite:
                finite[k, :c.logprobs_finite.shape[1]] = c.logprobs_finite[r].cpu()
        student = Completions(seqs, P, mask, [c.texts[r] for c, r in rows], logprobs, finite)
        scores = torch.cat([draws[d].scores[j * G:(j + 1) * G] for d, j in kept])
        return Draw(questions, [draws[d].teacher_texts[j] for d, j in kept], images, prompts, student, seconds, scores)

    def _judge(self, owners: list[Row], texts: list[str]) -> list[float]:
        if self.inputs.judge is None:
            return [rule_judge(r.answer, t, r.candidates) for r, t in zip(owners, texts)]
        return self.inputs.judge([r.question for r in owners], [r.answer for r in owners], texts)

    def _scored(self, owners: list[Row], texts: list[str],
                is_teacher: list[bool]) -> tuple[list[float], dict[str, list[float]]]:
        """The answer reward of each answer and, with rl.rewards, each function's own output."""
        if not self.terms:
            return self._judge(owners, texts), {}
        raw = {t.name: self._judge(owners, texts) if t.function is None else call(t, owners, texts, is_teacher)
               for t in self.terms}
        return weighted(self.terms, raw), raw

    def rewards(self, s, sample: QuestionSample, old) -> Returns:
        owners = [sample.questions[i // sample.per_question] for i in range(len(sample.texts))]
        teacher = sample.is_teacher.tolist()
        if self.terms:  # one call per function on the whole batch (dynamic sampling's scores are recomputed)
            answer, raw = self._scored(owners, sample.texts, teacher)
            sample.terms = {name: torch.tensor(v, dtype=torch.float64) for name, v in raw.items()}
        elif sample.student_scores is None:
            answer = self._judge(owners, sample.texts)
        else:  # dynamic sampling judged the student answers already: only the teachers' are left
            rest = [i for i, t in enumerate(teacher) if t]
            judged = dict(zip(rest, self._judge([owners[i] for i in rest], [sample.texts[i] for i in rest])
                                    if rest else []))
            students = iter(sample.student_scores.tolist())
            answer = [judged[i] if t else next(students) for i, t in enumerate(teacher)]
        sample.answer = torch.tensor(answer)
        sample.view = QuestionStep(sample.questions, sample.student.texts, sample.teacher_texts,
                                   sample.is_teacher, sample.metrics, s.policy, s.device, s.tokens_per_forward,
                                   batch=sample.batch, parts=sample.parts, part_rows=sample.rows)
        rewards = sample.answer
        window = self.cfg.overlong.penalty_window
        if window:  # DAPO's soft overlong punishment, on the student's answers
            penalty = overlong_penalty(sample.lengths, self.cfg.max_new_tokens, window, self.cfg.overlong.penalty)
            rewards = rewards + torch.where(sample.is_teacher.cpu(), torch.zeros_like(penalty), penalty)
        return Returns.single_turn(rewards, sample.per_question)

    def spread(self, s, sample, adv: torch.Tensor) -> Advantage:
        return Advantage(adv.flatten(), adv)  # [B]: one-turn episodes, one advantage per answer

    def after_update(self, s) -> None:
        if self.engine is not s.policy:  # the engine samples the next step: it wakes and gets the updated weights
            with s.updater.gathered():
                self.engine.sync_weights(s.policy)

    def curve_due(self, s, step: int) -> bool:
        return self.inputs.evaluator is not None and eval_due(step, self.cfg)

    def curve_point(self, s, step: int) -> dict[str, float]:
        if self.engine is not s.policy:  # awake with this step's weights (after_update synced them): it answers
            self.inputs.evaluator(step, self.engine)
            return {}
        with s.updater.gathered():  # whole weights under ZeRO-3 (collective); each rank answers its share
            self.inputs.evaluator(step, s.policy)
        return {}

    def cursor(self) -> dict:
        return {"order": self.order}

    def metrics(self, s, sample: QuestionSample, returns, adv, old, totals, seconds) -> dict[str, float]:
        # every answer's tokens, those overlong filtering leaves out of the loss too
        mask, answer, teacher = sample.batch.loss_mask.cpu().float(), sample.answer, sample.batch.is_teacher
        n_tok = float(mask.sum())
        m = {"reward": returns.episode[~teacher].mean().item(), "answer_reward_student": answer[~teacher].mean().item(),
             "response_length": float(mask[~teacher].sum() / max(int((~teacher).sum()), 1)),
             "advantage_mean": adv.tokens.mean().item(), "advantage_std": adv.tokens.std().item(),
             "samples_per_s": mask.shape[0] / seconds, "tokens_per_s": n_tok / seconds,
             "rollout_tokens_per_s": float(sample.student.completion_mask.sum()) / sample.rollout_s,
             "skipped_questions": float(self.skipped)}
        if teacher.any():
            m["answer_reward_teacher"] = answer[teacher].mean().item()
        for name, values in sample.terms.items():  # each function's raw output, before its weight
            m[f"reward/{name}"] = values[~teacher.cpu()].mean().item()
        if sample.engine is not None:  # how far the engine's distribution is from the policy's
            n_sampled = max(float(sample.engine.sampled.sum()), 1.0)
            m.update(tis_weight_mean=totals["is_sum"] / n_sampled, tis_capped_fraction=totals["is_capped"] / n_sampled,
                     rollout_logp_gap=totals["lp_gap"] / n_sampled, rollout_logp_nonfinite=sample.engine.nonfinite)
        return m

    def close(self, s) -> None:
        if self.engine is not s.policy:
            self.engine.close()
