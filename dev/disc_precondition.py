"""Probe: can the pretrained discriminator tell the SFT student's answers from the teachers'?

RIL's similarity reward carries a signal only if it can. On a small world this builds the tokenizer and a
tiny student, trains SFT briefly, samples student answers and scripted teacher answers for the RL split
(as the rollouts and teachers stages do, without curation), pretrains the discriminator as disc_pretrain
does, and prints its held-out accuracy and AUROC, and the share of held-out student answers it scores
below 0.5 (what RIL's binary similarity reward starts at). Not a stage; about 5 minutes on one thread.
  PYTHONPATH=. python dev/disc_precondition.py --out /tmp/precondition --sft-steps 400
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import pandas as pd
import torch

from protege.config import DiscPretrainConfig, ModelConfig, SFTConfig, WorldConfig
from protege.data.rows import image_path, image_paths, load_rows
from protege.eval.accuracy import evaluate_rows
from protege.files import file_sha256
from protege.generation.transformers_backend import Sampling, generate_answers
from protege.models.discriminator import load_discriminator
from protege.models.processor import StudentProcessor
from protege.models.student import build_student, save_student
from protege.models.tokenizer import train_tokenizer
from protege.stages.disc_pretrain import balanced_teacher_answers
from protege.stages.teachers import requests_for
from protege.teachers.backends import ScriptedTeacher, TeacherAnswer
from protege.train.disc_pretrain import Example, _batch, pretrain_discriminator, split_by_question
from protege.world.generate import generate_world


def vocabulary(frames: dict[str, pd.DataFrame]) -> list[str]:
    try:
        from protege.world.generate import vocabulary_texts
    except ImportError:  # before the accounts: the world stage's texts of that time
        from protege.world.teachers import all_templates

        train = frames["train"]
        return (list(train["question"]) + list(train["answer"]) + all_templates() * 20
                + [c for cands in train["candidates"] for c in json.loads(cands)])
    return vocabulary_texts(frames["train"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/precondition")
    ap.add_argument("--n-train", type=int, default=1800)
    ap.add_argument("--n-rl", type=int, default=288)
    ap.add_argument("--sft-steps", type=int, default=400)
    ap.add_argument("--disc-steps", type=int, default=200)
    ap.add_argument("--disc-lr", type=float, default=1e-3)
    ap.add_argument("--reuse", action="store_true", help="reuse --out's world, SFT student and answers")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--error-rate", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    out = Path(args.out)
    if args.reuse and (out / "answers.parquet").exists():  # the same world, SFT student and answers
        student, teacher = split_answers(pd.read_parquet(out / "answers.parquet"))
        proc = StudentProcessor.from_pretrained(out / "sft")
        rows = load_rows(out / "world" / "rl.parquet")
        return pretrain(args, out, proc, rows, student, teacher, t0)
    if out.exists():
        shutil.rmtree(out)
    wcfg = WorldConfig(n_train=args.n_train, n_rl=args.n_rl, n_val=9, n_test=9, vocab_size=1024)
    frames = generate_world(wcfg, out / "world")
    tok = train_tokenizer(vocabulary(frames), wcfg.vocab_size)
    proc = StudentProcessor.create(tok, wcfg.image_size, 8, 2)
    model = build_student(ModelConfig(), proc, args.seed)
    train = load_rows(out / "world" / "train.parquet")
    lengths = [len(tok(r.sft_target)["input_ids"]) for r in train]
    print(f"world + tokenizer {time.time() - t0:.0f} s; SFT target tokens mean {sum(lengths) / len(lengths):.1f} "
          f"max {max(lengths)}; e.g. {[r.sft_target for r in train[:3]]}", flush=True)
    t1 = time.time()
    train_sft(model, proc, train, args)
    print(f"sft {args.sft_steps} steps {time.time() - t1:.0f} s", flush=True)
    save_student(model, proc, out / "sft")

    rl_table = out / "world" / "rl.parquet"
    rows = load_rows(rl_table)
    summary, _ = evaluate_rows(model, proc, rows, 64, args.max_new_tokens)
    print(f"sft greedy accuracy on the rl split {summary['accuracy']:.3f} (chance {summary['chance']:.3f}); "
          + ", ".join(f"{k} {v:.2f}" for k, v in summary["per_kind"].items()), flush=True)
    torch.manual_seed(args.seed)
    n = 4
    sampling = Sampling(do_sample=True, temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=args.max_new_tokens)
    texts, _, _ = generate_answers(model, proc, [r.question for r in rows], [r.image for r in rows], sampling,
                                   batch_size=32, num_return_sequences=n)
    student = pd.DataFrame([{"question_id": r.id, "answer": texts[i * n + k]}
                            for i, r in enumerate(rows) for k in range(n)])

    questions = pd.read_parquet(rl_table)
    hashes = {rel: file_sha256(image_path(rl_table, rel)) for rec in questions.to_dict("records")
              for rel in image_paths(rec)}
    got = []
    for name in ("concise", "verbose"):
        accounts = {"accounts": True} if "accounts" in ScriptedTeacher.__dataclass_fields__ else {}
        backend = ScriptedTeacher(name, error_rate=args.error_rate, seed=args.seed, **accounts)
        reqs = requests_for(questions, rl_table, hashes, backend, proc, n)
        by_key = {r.key: r for r in reqs}
        backend.run(reqs, lambda o: got.append({"question_id": by_key[o.key].question_id, "teacher": name,
                                                "answer": o.text}) if isinstance(o, TeacherAnswer) else None)
    teacher = balanced_teacher_answers(pd.DataFrame(got), student, args.seed)
    pd.concat([student.assign(teacher=""), teacher], ignore_index=True).to_parquet(out / "answers.parquet")
    for qid in list(student["question_id"].unique())[:4]:
        print("  student:", list(student[student["question_id"] == qid]["answer"])[:2],
              " teacher:", list(teacher[teacher["question_id"] == qid]["answer"])[:2])
    pretrain(args, out, proc, rows, student, teacher, t0)


def split_answers(answers: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    is_student = answers["teacher"] == ""
    return answers[is_student].reset_index(drop=True), answers[~is_student].reset_index(drop=True)


def pretrain(args, out: Path, proc, rows, student: pd.DataFrame, teacher: pd.DataFrame, t0: float) -> None:
    by_id = {r.id: r for r in rows}
    examples = [Example(qid, by_id[qid].question, by_id[qid].image, ans, label)
                for frame, label in ((student, 1.0), (teacher, 0.0))
                for qid, ans in zip(frame["question_id"], frame["answer"])]

    t2 = time.time()
    disc = load_discriminator(out / "sft", from_student=True)
    cfg = DiscPretrainConfig(steps=args.disc_steps, batch_size=32, lr=args.disc_lr, holdout_fraction=0.2,
                             device="cpu")
    result = pretrain_discriminator(disc, proc, examples, cfg, args.seed, on_log=lambda s, m: print(
        f"  disc step {s} loss {m['loss']:.3f} batch accuracy {m['train_batch_accuracy']:.2f}", flush=True))
    _, held = split_by_question(examples, cfg.holdout_fraction, args.seed)
    disc.eval()
    with torch.no_grad():
        scores = []
        for i in range(0, len(held), 64):
            scores += torch.sigmoid(disc(**_batch(proc, held[i:i + 64]))).tolist()
    student_scores = [s for s, e in zip(scores, held) if e.label == 1]
    teacher_scores = [s for s, e in zip(scores, held) if e.label == 0]
    sim_student = sum(s < 0.5 for s in student_scores) / len(student_scores)
    sim_teacher = sum(s < 0.5 for s in teacher_scores) / len(teacher_scores)
    print(f"disc_pretrain {args.disc_steps} steps {time.time() - t2:.0f} s: held-out accuracy "
          f"{result['heldout_accuracy']:.3f}, AUROC {result['heldout_auroc']:.3f} ({result['heldout_examples']} "
          f"answers); similarity reward (D < 0.5) of held-out student answers {sim_student:.3f}, of teacher "
          f"answers {sim_teacher:.3f}; total {time.time() - t0:.0f} s", flush=True)


def train_sft(model, proc, rows, args) -> None:
    from protege.train.sft import train_sft as sft

    random.seed(args.seed)
    sft(model, proc, rows, SFTConfig(steps=args.sft_steps, batch_size=32, lr=2e-3, warmup_steps=50,
                                     log_every=max(1, args.sft_steps // 4), device="cpu"), args.seed,
        on_log=lambda s, m: print(f"  sft step {s} loss {m['loss']:.3f}", flush=True))


if __name__ == "__main__":
    main()
