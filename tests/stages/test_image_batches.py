"""Images decoded per batch by worker processes change nothing the stages compute (SFT and discriminator
weights, exact resume, scores, answers), and training on a table whose images would not fit in memory decoded
together needs memory for a few batches only."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from PIL import Image

from protege.config import DiscPretrainConfig, ModelConfig, SFTConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.student import build_student, load_student, save_student
from protege.train.disc_pretrain import Example, pretrain_discriminator
from protege.train.sft import train_sft
from tests.conftest import REPO

SFT = dict(steps=4, batch_size=6, lr=2e-3, warmup_steps=1, log_every=1, save_every=2, device="cpu")


@pytest.fixture(scope="module")
def base(tiny_processor, tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    save_student(build_student(ModelConfig(), tiny_processor, seed=0), tiny_processor, path)
    return path


def sft(base, rows, workers, **kw):
    model, processor = load_student(base)
    logs = []
    train_sft(model, processor, rows, SFTConfig(**SFT), seed=0, workers=workers,
              on_log=lambda s, m: logs.append((s, m["loss"], m["grad_norm"])), **kw)
    return model.state_dict(), logs


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sft_with_decoding_workers_is_bitwise_the_in_process_run_and_resumes(base, tiny_world, tmp_path):
    rows = load_rows(tiny_world / "train.parquet")
    alone, alone_logs = sft(base, rows, 0)
    ahead, ahead_logs = sft(base, rows, 2)
    assert ahead_logs == alone_logs and same_weights(alone, ahead)
    sft(base, rows, 2, state_dir=tmp_path / "state", stop_after=3)  # killed in step 3: step 2's state is saved
    resumed, resumed_logs = sft(base, rows, 2, state_dir=tmp_path / "state")
    assert resumed_logs == alone_logs[2:] and same_weights(alone, resumed)


def test_discriminator_on_row_files_decoded_by_workers_is_bitwise(base, tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "train.parquet")
    cfg = DiscPretrainConfig(steps=3, batch_size=6, lr=1e-3, holdout_fraction=0.25, device="cpu")

    def train(image, workers):
        torch.manual_seed(1)
        disc = Discriminator(load_student(base)[0].model)
        examples = [Example(r.id, r.question, image(r), r.answer if i % 2 else f"It is {r.answer}.", float(i % 2))
                    for i, r in enumerate(rows)]
        logs = []
        result = pretrain_discriminator(disc, tiny_processor, examples, cfg, seed=0, workers=workers,
                                        on_log=lambda s, m: logs.append((s, m["loss"])))
        return disc.state_dict(), logs, result["heldout_auroc"]

    decoded = train(lambda r: r.image, 0)  # images in memory, as before rows held paths
    files = train(lambda r: r.source, 2)
    assert decoded[1] == files[1] and decoded[2] == files[2] and same_weights(decoded[0], files[0])


def test_scores_and_answers_do_not_depend_on_the_workers(tiny_student, tiny_processor, tiny_world):
    from protege.data.curate import answer_logprobs
    from protege.eval.accuracy import evaluate_rows

    rows = load_rows(tiny_world / "test.parquet")[:10]
    assert answer_logprobs(tiny_student, tiny_processor, rows, 4, workers=2) == \
        answer_logprobs(tiny_student, tiny_processor, rows, 4, workers=0)
    seen = []
    with_workers = evaluate_rows(tiny_student, tiny_processor, rows, 4, 4, workers=2,
                                 progress=lambda d, t: seen.append((d, t)))[1]
    assert with_workers == evaluate_rows(tiny_student, tiny_processor, rows, 4, 4)[1]
    assert seen == [(4, 10), (8, 10), (10, 10)]


def test_sampled_rollouts_do_not_depend_on_the_workers(tiny_student, tiny_processor, tiny_world):
    """Sampling reads the global torch RNG: starting decoding workers must not draw from it."""
    from protege.data.loader import image_batches
    from protege.generation.transformers_backend import Sampling, generate_answers

    rows = load_rows(tiny_world / "rl.parquet")[:6]
    sampling = Sampling(do_sample=True, temperature=1.0, max_new_tokens=6)

    def answers(workers):
        torch.manual_seed(5)
        return generate_answers(tiny_student, tiny_processor, [r.question for r in rows], None, sampling, 4,
                                num_return_sequences=2, image_batches=image_batches(rows, 4, workers))[:2]
    assert answers(2) == answers(0)


SIDE = 2048      # a solid colour: a 17 kB PNG, 12 MiB decoded
ROWS = 64        # 768 MiB decoded together
HEADROOM = 400   # MiB a run may add to what the process holds once its model trained a step


@pytest.fixture(scope="module")
def big_table(tmp_path_factory, tiny_world):
    """ROWS questions of the world on SIDE x SIDE images (four files, each row decoding its own copy), and a
    table of small images the worker warms up on."""
    folder = tmp_path_factory.mktemp("big")
    (folder / "images").mkdir()
    world = pd.read_parquet(tiny_world / "train.parquet")  # questions and answers the tokenizer knows
    for k in range(4):
        Image.new("RGB", (SIDE, SIDE), (60 * k, 200 - 40 * k, 90)).save(folder / "images" / f"big{k}.png")
        Image.new("RGB", (64, 64), (60 * k, 200 - 40 * k, 90)).save(folder / "images" / f"small{k}.png")

    def table(name: str, prefix: str, n: int) -> None:
        pd.DataFrame([{"id": f"q{i}", "kind": "", "question": world["question"].iloc[i % len(world)],
                       "answer": world["answer"].iloc[i % len(world)], "candidates": "[]",
                       "image": f"images/{prefix}{i % 4}.png"} for i in range(n)]).to_parquet(folder / name,
                                                                                              index=False)
    table("big.parquet", "big", ROWS)
    table("small.parquet", "small", 8)
    return folder / "big.parquet"


def run_worker(base, table, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.stages.memory_worker", str(base), str(table), *args,
                           "--limit-mib", str(HEADROOM)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA and ru_maxrss as Linux counts them")
def test_sft_on_images_that_would_not_fit_decoded_together_runs_in_a_few_batches_of_memory(base, big_table):
    """The child may allocate HEADROOM MiB more than it holds after a warm-up step (RLIMIT_DATA, which its
    decoding workers inherit): decoding the table up front, as rows did before, fails there; training with
    two decoding workers runs, and its peak resident memory grows by far less than the table decoded."""
    decoded_mib = ROWS * SIDE * SIDE * 3 / 2**20
    assert decoded_mib > 1.5 * HEADROOM
    held = run_worker(base, big_table, "0", "--hold")
    assert held.returncode != 0 and "MemoryError" in held.stderr, held.stderr[-3000:]
    ran = run_worker(base, big_table, "2")
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert len(report["losses"]) == 3 and report["held"] == 0
    assert report["growth_mib"] < HEADROOM < decoded_mib, report
