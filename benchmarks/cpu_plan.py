"""`protege plan --device cpu` against a CPU run's measured peak resident memory: one SFT step or one RL step
of a mid-size student (the embedded Qwen2-VL architecture at hidden 1024, 2 layers, its vocabulary grown to
152,064 rows), in a fresh process. Prints one JSON line: the stage's plan (its parts and peak) and the
process's peak resident set size (ru_maxrss), and their ratio.

    .venv/bin/python benchmarks/cpu_plan.py --stage sft
    .venv/bin/python benchmarks/cpu_plan.py --stage rl [--hidden 1024] [--vocab 152064] [--threads 2]
    .venv/bin/python benchmarks/cpu_plan.py --stage ril-7b

`ril-7b`: one RIL step as the README recipe sets it (bf16, LoRA r128 on the policy and on a discriminator
beside it, gradient checkpointing, no reference copy) on Qwen2.5-VL-7B's text widths (hidden 3584, MLP
18944, 28 / 4 heads, vocabulary 152,064) truncated to 2 layers, at a CPU's batch (4 questions x (4 samples +
4 teacher answers), 32 new tokens). The models are built in bf16 and the process's peak resident set is
reset (/proc/self/clear_refs) once they are set up, so the figure is the step's peak, set-up copies aside.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
from pathlib import Path

import torch

QUESTIONS, GROUP, NEW_TOKENS = 4, 4, 32


def student(hidden: int, vocab: int, out: Path, widths: dict | None = None):
    """The mid-size student (or one of `widths`), its processor, the world's rows, and a folder holding its
    config.json."""
    from protege.config import ModelConfig, WorldConfig
    from protege.data.rows import load_rows
    from protege.models.processor import StudentProcessor
    from protege.models.student import build_student
    from protege.models.tokenizer import train_tokenizer
    from protege.world.generate import generate_world
    from protege.world.questions import make_item
    from protege.world.teachers import all_templates

    generate_world(WorldConfig(n_train=16, n_rl=QUESTIONS, n_val=4, n_test=4), out / "world")
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    texts = [i.question for i in items] + [i.answer for i in items] + all_templates() * 5
    processor = StudentProcessor.create(train_tokenizer(texts, 400), 64, 8, 2)
    model_cfg = ModelConfig(num_layers=2, **(widths or dict(hidden_size=hidden, num_heads=8, num_kv_heads=2,
                                                            intermediate_size=hidden * 11 // 4)))
    model = build_student(model_cfg, processor, seed=0)
    old = model.get_output_embeddings().weight.shape[0]
    model.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():  # sampling keeps to the tokenizer's own tokens
        model.get_output_embeddings().weight[old:] = 0.0
    model.config.get_text_config().vocab_size = vocab
    folder = out / "model"
    model.config.save_pretrained(folder)
    return model, processor, load_rows(out / "world" / "train.parquet"), load_rows(out / "world" / "rl.parquet"), folder


def lengths_of(processor, rows, answer_tokens: int):
    """The longest prompt (image tokens included) and answer of these rows, as the plan takes them."""
    from protege.plan import Lengths

    qs, ims = [r.question for r in rows], [r.image for r in rows]
    prompts = processor.encode_pairs(qs, ims, [""] * len(rows))["attention_mask"].sum(dim=1)
    whole = processor.encode_pairs(qs, ims, [r.answer for r in rows])["attention_mask"].sum(dim=1)
    return Lengths(prompt=int(prompts.max()), answer=max(int((whole - prompts).max()), answer_tokens))


def run(stage: str, hidden: int, vocab: int, threads: int) -> dict:
    import copy

    from protege.config import Config
    from protege.plan import model_shape, plan_stages

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        if stage != "ril-7b":
            model, processor, train, rl_rows, folder = student(hidden, vocab, out)
        if stage == "sft":
            from protege.train.sft import train_sft

            cfg = Config().model_copy(update={"sft": Config().sft.model_copy(
                update={"steps": 1, "batch_size": 8, "warmup_steps": 0, "device": "cpu"})})
            train_sft(model, processor, train, cfg.sft, seed=0)
            lengths = lengths_of(processor, train, 0)
        elif stage == "ril-7b":
            cfg, lengths = ril_step(out)
            folder = out / "model"
        else:
            from protege.rl.loop import RLInputs, run_rl

            rl = Config().rl.model_copy(update={"algorithm": "dr_grpo", "steps": 1, "questions_per_step": QUESTIONS,
                                                "group_size": GROUP, "max_new_tokens": NEW_TOKENS, "device": "cpu",
                                                "trainable": "attention", "kl_beta": 0.04, "save_every": 100,
                                                "eval_every": 0})
            cfg = Config().model_copy(update={"rl": rl})
            run_rl(model, copy.deepcopy(model), processor, RLInputs(rl_rows), cfg.rl, out / "rl", seed=0)
            lengths = lengths_of(processor, rl_rows, NEW_TOKENS)
        measured = (peak_since_reset() if stage == "ril-7b"
                    else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        shape = model_shape(cfg, out, folder)
        [plan] = [p for p in plan_stages(cfg, shape, lengths=lengths, device_type="cpu")
                  if p.stage == {"ril-7b": "rl"}.get(stage, stage)]
    return {"part": "cpu_plan", "stage": stage, "hidden": shape.hidden, "vocab": shape.vocab, "params": shape.params,
            "plan_parts_mib": {k: round(v / 2**20, 1) for k, v in plan.parts.items()}, "phase": plan.phase,
            "plan_peak_mib": round(plan.peak / 2**20, 1), "measured_peak_mib": round(measured / 2**20, 1),
            "ratio": round(plan.peak / measured, 3)}


def peak_since_reset() -> int:
    """VmHWM: the resident set's peak since the last reset_peak()."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def reset_peak() -> None:
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")


def ril_step(out: Path):
    """One RIL step at 7B widths, as the README recipe sets it (module docstring)."""
    import copy

    from protege.config import Config
    from protege.models.discriminator import Discriminator
    from protege.models.lora import add_lora
    from protege.models.precision import with_precision
    from protege.rl.loop import RLInputs, run_rl
    from protege.world.teachers import scripted_answer

    widths = dict(hidden_size=3584, num_heads=28, num_kv_heads=4, intermediate_size=18944)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no fp32 copy of a 1.5B-parameter model first
    try:
        model, processor, _, rows, _ = student(3584, 152_064, out, widths)
        disc = Discriminator(copy.deepcopy(model.model))
    finally:
        torch.set_default_dtype(torch.float32)
    base = Config()
    cfg = base.model_copy(update={
        "model": base.model.model_copy(update={"dtype": "bfloat16", "gradient_checkpointing": True}),
        "rl": base.rl.model_copy(update={"algorithm": "ril", "steps": 1, "questions_per_step": QUESTIONS,
                                         "group_size": GROUP, "max_new_tokens": NEW_TOKENS, "device": "cpu",
                                         "trainable": "lora", "disc_trainable": "lora", "save_every": 100,
                                         "eval_every": 0})})
    lora = cfg.model.lora
    disc.head.float()  # the head stays float32 (Discriminator.keep_in_float32)
    disc = with_precision(disc, "bfloat16").enable_recompute()
    disc.add_lora(lora.rank, lora.alpha, lora.dropout, lora.target_modules)
    policy = with_precision(model, "bfloat16")
    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = add_lora(policy, lora.rank, lora.alpha, lora.dropout, lora.target_modules)
    answers = {r.id: [(style, scripted_answer(style, r.kind, r.answer, r.candidates, r.id, k, 0.0, 0))
                      for k in range(2) for style in ("concise", "verbose")] for r in rows}
    reset_peak()
    run_rl(policy, None, processor, RLInputs(rows, answers, disc), cfg.rl, out / "rl", seed=0)
    return cfg, lengths_of(processor, rows, NEW_TOKENS)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=["sft", "rl", "ril-7b"], required=True)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=152_064)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    result = run(args.stage, args.hidden, args.vocab, args.threads)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
