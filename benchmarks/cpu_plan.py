"""`protege plan --device cpu` against a CPU run's measured peak resident memory: one SFT step or one RL step
of a mid-size student (the embedded Qwen2-VL architecture at hidden 1024, 2 layers, its vocabulary grown to
152,064 rows), in a fresh process. Prints one JSON line: the stage's plan (its parts and peak) and the
process's peak resident set size (ru_maxrss), and their ratio.

    .venv/bin/python benchmarks/cpu_plan.py --stage sft
    .venv/bin/python benchmarks/cpu_plan.py --stage rl [--hidden 1024] [--vocab 152064] [--threads 2]
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


def student(hidden: int, vocab: int, out: Path):
    """The mid-size student, its processor, the world's rows, and a folder holding its config.json."""
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
    model_cfg = ModelConfig(hidden_size=hidden, num_layers=2, num_heads=8, num_kv_heads=2,
                            intermediate_size=hidden * 11 // 4)
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
    from protege.config import Config
    from protege.plan import model_shape, plan_stages

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        model, processor, train, rl_rows, folder = student(hidden, vocab, out)
        if stage == "sft":
            from protege.train.sft import train_sft

            cfg = Config().model_copy(update={"sft": Config().sft.model_copy(
                update={"steps": 1, "batch_size": 8, "warmup_steps": 0, "device": "cpu"})})
            train_sft(model, processor, train, cfg.sft, seed=0)
            lengths = lengths_of(processor, train, 0)
        else:
            from protege.rl.loop import RLInputs, run_rl

            rl = Config().rl.model_copy(update={"algorithm": "dr_grpo", "steps": 1, "questions_per_step": QUESTIONS,
                                                "group_size": GROUP, "max_new_tokens": NEW_TOKENS, "device": "cpu",
                                                "trainable": "attention", "kl_beta": 0.04, "save_every": 100,
                                                "eval_every": 0})
            cfg = Config().model_copy(update={"rl": rl})
            import copy

            run_rl(model, copy.deepcopy(model), processor, RLInputs(rl_rows), cfg.rl, out / "rl", seed=0)
            lengths = lengths_of(processor, rl_rows, NEW_TOKENS)
        measured = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        shape = model_shape(cfg, out, folder)
        [plan] = [p for p in plan_stages(cfg, shape, lengths=lengths, device_type="cpu") if p.stage == stage]
    return {"part": "cpu_plan", "stage": stage, "hidden": hidden, "vocab": vocab, "params": shape.params,
            "plan_parts_mib": {k: round(v / 2**20, 1) for k, v in plan.parts.items()}, "phase": plan.phase,
            "plan_peak_mib": round(plan.peak / 2**20, 1), "measured_peak_mib": round(measured / 2**20, 1),
            "ratio": round(plan.peak / measured, 3)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=["sft", "rl"], required=True)
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
