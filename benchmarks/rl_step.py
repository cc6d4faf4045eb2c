"""Seconds per RL step, samples/s and tokens/s of the RL loop, for `dr_grpo`, DAPO's recipe and `ril`, and
against TRL.

Fixed work: the tiny Qwen2-VL student (params.yaml `model` sizes) freshly initialised from seed 0,
8 questions x G=4 samples (+4 teacher answers for ril), 16 new tokens at most, on the CPU.

DAPO's recipe (`dapo`): grpo's advantage, clip-higher 0.2 / 0.28, token_mean, no KL term (no reference
forward), the soft overlong punishment over the last 4 tokens and dynamic sampling of up to 3 draws. The
untrained student answers every question wrong, so every group scores alike and each step draws 3 times: the
figure is dynamic sampling's worst case (its line shows the draws per step and the share of groups dropped);
`dapo_one_draw` is the recipe without dynamic sampling.

TRL comparison (needs the `bench` extra: pip install -e '.[bench]'): the same 8 text-only prompts x G=4,
16 new tokens, same sampling, rule-judge reward, Dr.GRPO loss with unscaled rewards, beta 0.04, one
policy update per step, same trainable parameters. Ours runs the student text-only (no pixel_values:
the Qwen2-VL model is then a plain LM); TRL gets a Qwen2ForCausalLM with the same sizes and the same
text weights (with one position per token, Qwen2-VL's 3-D rope equals plain rope), and our tokenizer,
saved to a temporary folder. Nothing is downloaded.

Each of our runs also prints the padded share of the tokens its forwards hold (policy, pi_old and pi_ref alike):
in the length-grouped micro-batches it runs, and had every row been padded to the step's widest (the split
before length groups). `--micro-batch-tokens` sets the budget (rl.micro_batch_tokens; unset: derived, one
forward unless the padding saved outweighs a forward's overhead).

    .venv/bin/python benchmarks/rl_step.py [--steps 5] [--threads 2] [--micro-batch-tokens N] [--no-trl]
                                           [--runs dr_grpo,dapo,dapo_one_draw,ril,dr_grpo_text]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from protege.config import ModelConfig, RLConfig, WorldConfig
from protege.data.rows import Row, load_rows
from protege.models.discriminator import Discriminator
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.rewards.judge import rule_judge
from protege.rl.loop import RLInputs, run_rl
from protege.rl.trainable import select_trainable
from protege.world.generate import generate_world
from protege.world.teachers import all_templates, scripted_answer

QUESTIONS, G, NEW_TOKENS = 8, 4, 16
DAPO = dict(clip_eps_low=0.2, clip_eps_high=0.28, loss_aggregation="token_mean", kl_beta=0.0,
            overlong={"penalty_window": 4, "penalty": 1.0}, dynamic_sampling={"max_draws": 3})


def summarise(name: str, seconds: list[float], samples: int, tokens: list[float]) -> dict:
    r = {"seconds_per_step": statistics.median(seconds), "samples_per_s": statistics.median(samples / s for s in seconds),
         "tokens_per_s": statistics.median(t / s for t, s in zip(tokens, seconds))}
    print(f"{name:14s} {r['seconds_per_step']:.3f} s/step  {r['samples_per_s']:.1f} samples/s  "
          f"{r['tokens_per_s']:.1f} tokens/s  (median of {len(seconds)} steps, {samples} sequences/step)")
    return r


def ours(name, student, processor, rows, answers, algorithm, steps, out: Path, tokens: int | None = None,
         **settings) -> dict:
    # one step more than run, so that the last timed step does not include writing the final checkpoint
    cfg = RLConfig(algorithm=algorithm, steps=steps + 2, questions_per_step=QUESTIONS, group_size=G,
                   max_new_tokens=NEW_TOKENS, save_every=10_000, device="cpu", micro_batch_tokens=tokens, **settings)
    logs: list[dict] = []
    disc = Discriminator(copy.deepcopy(student.model)) if algorithm == "ril" else None
    ref = copy.deepcopy(student) if cfg.kl_beta > 0 else None  # the stage loads none without a KL term
    run_rl(copy.deepcopy(student), ref, processor, RLInputs(rows, answers, disc), cfg, out,
           seed=0, on_log=lambda s, m: logs.append(m), stop_after=steps + 1)
    timed = logs[1:]  # the first step pays one-off costs
    seconds = [m["step_s"] for m in timed]
    # the answers each step trains on: QUESTIONS x G (x 2 for ril), fewer where dynamic sampling ran out of draws
    samples = round(statistics.median(m["samples_per_s"] * m["step_s"] for m in timed))
    r = summarise(name, seconds, samples, [m["tokens_per_s"] * s for m, s in zip(timed, seconds)])
    # over every step: padded tokens / tokens in the forwards
    r.update(padded_share=statistics.mean(m["padded_share"] for m in logs),
             padded_share_batch_wide=statistics.mean(m["padded_share_batch_wide"] for m in logs),
             micro_batches=statistics.mean(m["micro_batches"] for m in logs))
    print(f"{'':14s} padded share of forward tokens: {r['padded_share_batch_wide']:.1%} padded to the batch's widest "
          f"row, {r['padded_share']:.1%} in length groups ({r['micro_batches']:.1f} forwards per pass)")
    if "dynamic_sampling_draws" in logs[0]:
        r.update(draws_per_step=statistics.mean(m["dynamic_sampling_draws"] for m in timed),
                 dropped_share=statistics.mean(m["dynamic_sampling_dropped"] for m in timed))
        print(f"{'':14s} dynamic sampling: {r['draws_per_step']:.1f} draws per step, {r['dropped_share']:.0%} of the "
              f"groups drawn dropped (their answers all scored alike)")
    return r


def text_lm(student, processor: StudentProcessor, folder: Path) -> Path:
    """Our student's language half as a transformers Qwen2ForCausalLM, saved with our tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    t = student.config.text_config
    cfg = Qwen2Config(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                      num_hidden_layers=t.num_hidden_layers, num_attention_heads=t.num_attention_heads,
                      num_key_value_heads=t.num_key_value_heads, max_position_embeddings=t.max_position_embeddings,
                      rms_norm_eps=t.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=t.eos_token_id,
                      pad_token_id=t.pad_token_id)
    lm = Qwen2ForCausalLM(cfg)
    weights = {f"model.{k}": v for k, v in student.model.language_model.state_dict().items()}
    weights["lm_head.weight"] = student.lm_head.weight
    missing, unexpected = lm.load_state_dict(weights, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    lm.generation_config.eos_token_id, lm.generation_config.pad_token_id = t.eos_token_id, t.pad_token_id
    lm.generation_config.bos_token_id = None
    lm.save_pretrained(str(folder))
    processor.tokenizer.save_pretrained(str(folder))
    return folder


def trl_run(student, processor, rows: list[Row], steps: int, tmp: Path) -> dict:
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    base = RLConfig()  # same sampling / loss hyper-parameters as ours
    folder = text_lm(student, processor, tmp / "trl-model")
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    select_trainable(model, base.trainable)  # the Trainer's optimizer then takes the same parameters as ours
    tok = AutoTokenizer.from_pretrained(str(folder))
    # plain-text prompts, already in our chat format: both sides tokenise exactly the same string
    ds = Dataset.from_list([{"prompt": processor.prompt(r.question, 0), "answer": r.answer,
                             "candidates": r.candidates} for r in rows])

    def rule_reward(prompts, completions, answer, candidates, **_):
        return [rule_judge(a, c.strip(), cands) for a, c, cands in zip(answer, completions, candidates)]

    args = trl.GRPOConfig(
        output_dir=str(tmp / "trl-out"), max_steps=steps + 1, learning_rate=base.lr, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=QUESTIONS * G,
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=G, num_iterations=1,
        max_completion_length=NEW_TOKENS, temperature=base.temperature, top_p=base.top_p, top_k=base.top_k,
        repetition_penalty=base.repetition_penalty, beta=base.kl_beta, epsilon=base.clip_eps,
        loss_type="dr_grpo", scale_rewards="none", use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=1, seed=0, bf16=False, fp16=False, dataloader_num_workers=0, disable_tqdm=True)
    seconds: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            seconds.append(time.perf_counter() - self.t0)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    trainer = trl.GRPOTrainer(model=model, reward_funcs=rule_reward, args=args, train_dataset=ds,
                              processing_class=tok, callbacks=[Clock()])
    trainer.train()
    samples = QUESTIONS * G
    return summarise(f"trl {trl.__version__}", seconds[1:], samples, [n * samples for n in lengths[1:]])


def trl_missing() -> str | None:
    try:
        import trl  # noqa: F401
    except ImportError as exc:
        return f"{exc} (install the bench extra: pip install -e '.[bench]')"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=None,
                    help="tokens per forward (rl.micro_batch_tokens); unset: derived from the model")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    ap.add_argument("--runs", default="dr_grpo,dapo,dapo_one_draw,ril,dr_grpo_text",
                    help="which of our runs, comma-separated (dr_grpo_text is the TRL comparison's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        frames = generate_world(WorldConfig(n_train=200, n_rl=64, n_test=8), Path(tmp))
        texts = list(frames["train"]["question"]) + list(frames["train"]["answer"]) + all_templates() * 20
        processor = StudentProcessor.create(train_tokenizer(texts, 512), 64, 8, 2)
        student = build_student(ModelConfig(), processor, seed=0)
        rows = load_rows(Path(tmp) / "rl.parquet")
        answers = {r.id: [(t, scripted_answer(t, r.kind, r.answer, r.candidates, r.id, k, 0.1, 0))
                          for t in ("concise", "verbose") for k in range(4)] for r in rows}
        print(f"threads {torch.get_num_threads()}; student {sum(p.numel() for p in student.parameters()):,} params")
        results = {}
        runs = args.runs.split(",")
        no_dynamic = {**DAPO, "dynamic_sampling": {"max_draws": 0}}  # the recipe's update alone, one draw a step
        for name, algorithm, settings in (("dr_grpo", "dr_grpo", {}), ("dapo", "grpo", DAPO),
                                          ("dapo_one_draw", "grpo", no_dynamic), ("ril", "ril", {})):
            if name in runs:
                results[name] = ours(name, student, processor, rows, answers, algorithm, args.steps, Path(tmp) / name,
                                     args.micro_batch_tokens, **settings)
        for name in ("dapo", "dapo_one_draw"):
            if "dr_grpo" in results and name in results:
                ratio = results[name]["seconds_per_step"] / results["dr_grpo"]["seconds_per_step"]
                print(f"{name} / dr_grpo: {ratio:.2f}x the seconds per step")
        # the comparison: text-only prompts (the first QUESTIONS rows, one step's worth, repeated each step)
        text_rows = [Row(r.id, r.kind, r.question, r.answer, r.candidates, None) for r in rows[:QUESTIONS]]
        if "dr_grpo_text" in runs:
            results["dr_grpo_text"] = ours("dr_grpo text", student, processor, text_rows, {}, "dr_grpo", args.steps,
                                           Path(tmp) / "text", args.micro_batch_tokens)
        skip = "--no-trl" if args.no_trl else ("no dr_grpo_text run" if "dr_grpo_text" not in runs else trl_missing())
        if skip:
            print(f"TRL comparison skipped: {skip}")
        else:
            results["trl_dr_grpo_text"] = r = trl_run(student, processor, text_rows, args.steps, Path(tmp))
            mine = results["dr_grpo_text"]
            results["ours_over_trl"] = ratio = {k: (r[k] / mine[k] if k == "seconds_per_step" else mine[k] / r[k])
                                                for k in r}
            print(f"ours / TRL: {ratio['seconds_per_step']:.2f}x speed by s/step, {ratio['samples_per_s']:.2f}x "
                  f"samples/s, {ratio['tokens_per_s']:.2f}x tokens/s (>1: ours faster)")
        print(json.dumps(results))


if __name__ == "__main__":
    main()
