"""One process of an SFT (+ discriminator pretraining) run on the shared training runtime.

Launched by test_sft_runtime.py, one process per rank with RANK / WORLD_SIZE / MASTER_* in the
environment as torchrun sets them; the test also calls `run` in its own process for the single-process
reference. Writes `<tag>-rank<r>.json` (the logged losses) and, from rank 0, `<tag>-sft.safetensors` and
`<tag>-disc.safetensors` (the final weights).
"""
import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from protege.config import DiscPretrainConfig, SFTConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.student import load_student
from protege.train.disc_pretrain import Example, pretrain_discriminator
from protege.train.sft import train_sft

SFT = dict(steps=4, batch_size=6, lr=2e-3, warmup_steps=2, log_every=1, save_every=2)  # warm-up + cosine
DISC = dict(steps=2, batch_size=6, lr=1e-3, holdout_fraction=0.25, save_every=1)


def examples(rows) -> list[Example]:
    """Student-like (1) and teacher-like (0) answers to the same questions."""
    return [Example(r.id, r.question, r.image, r.answer if i % 2 else f"The answer is {r.answer}.", float(i % 2))
            for i, r in enumerate(rows)]


def _weights(model) -> dict:
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}


def run(base: Path, world_dir: Path, out: Path, tag: str, backend: str, zero_stage: int = 2,
        stop_after: int | None = None, state: bool = False, disc: bool = True) -> dict:
    rank = int(os.environ.get("RANK", 0))
    model, processor = load_student(base)
    rows = load_rows(world_dir / "train.parquet")
    logs: dict[str, list] = {"sft": [], "disc": []}
    cfg = SFTConfig(**SFT, backend=backend, zero_stage=zero_stage, device="cpu")

    def save(name):
        return lambda m: save_file(_weights(m), str(out / f"{tag}-{name}.safetensors"))

    result = train_sft(model, processor, rows, cfg, seed=0, on_log=lambda s, m: logs["sft"].append([s, m["loss"]]),
                       state_dir=out / f"{tag}-state" if state else None, stop_after=stop_after, save_final=save("sft"))
    if disc and stop_after is None:
        torch.manual_seed(1)  # the head starts at zero; this only fixes what the backbone copy does not
        d = Discriminator(load_student(base)[0].model)
        dcfg = DiscPretrainConfig(**DISC, backend=backend, zero_stage=zero_stage, device="cpu")
        pretrain_discriminator(d, processor, examples(rows), dcfg, seed=0,
                               on_log=lambda s, m: logs["disc"].append([s, m["loss"]]), save_final=save("disc"))
    report = {"logs": logs, "resumed_after_step": result["resumed_after_step"]}
    (out / f"{tag}-rank{rank}.json").write_text(json.dumps(report))
    return report


def resume_scenario(base: Path, world_dir: Path, out: Path, backend: str) -> dict:
    """An uninterrupted run ("whole"), a run stopped after step 3 whose last state is step 2's (a kill during
    step 3), and a fresh start of that run, which resumes from the state. Reports of all three in resume.json."""
    report = {"whole": run(base, world_dir, out, "whole", backend, disc=False),
              "stopped": run(base, world_dir, out, "cut", backend, stop_after=3, state=True, disc=False),
              "resumed": run(base, world_dir, out, "cut", backend, state=True, disc=False)}
    (out / "resume.json").write_text(json.dumps(report))
    return report


if __name__ == "__main__":
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("world", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tag", default="run")
    ap.add_argument("--backend", default="deepspeed")
    ap.add_argument("--zero-stage", type=int, default=2)
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--state", action="store_true")
    ap.add_argument("--no-disc", action="store_true")
    ap.add_argument("--resume-scenario", action="store_true", help="run resume_scenario instead of one run")
    a = ap.parse_args()
    if a.resume_scenario:
        resume_scenario(a.base, a.world, a.out, a.backend)
    else:
        run(a.base, a.world, a.out, a.tag, a.backend, a.zero_stage, a.stop_after, a.state, not a.no_disc)
