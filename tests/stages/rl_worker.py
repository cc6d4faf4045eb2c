"""A resumable RL run on the tiny world in its own process (killed and re-run by test_rl_loop.py).

It uses the rl stage's own resume path: prepare_out_dir keeps a matching state (dropping checkpoints
newer than it), run_rl resumes from it. Writes final.safetensors (the policy's weights) when done.
"""
import argparse
import copy
import random
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from protege.config import ModelConfig, RLConfig, WorldConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.rl.loop import RLInputs, fingerprint, run_rl
from protege.runtime.run_folder import STATE, prepare_out_dir
from protege.world.generate import generate_world
from protege.world.questions import make_item

# RIL with scripted teacher answers in every group: they earn reward, so the weights move at every step
# (an untrained student alone earns none, and a resume test on weights that never move proves nothing)
CFG = RLConfig(steps=5, questions_per_step=2, group_size=2, max_new_tokens=4, lr=1e-3, save_every=1,
               algorithm="ril")


def main(out: Path, step_delay: float) -> None:
    torch.set_num_threads(1)  # same kernels in every run: the comparison is bitwise
    if not (out / "world").exists():
        generate_world(WorldConfig(n_train=8, n_rl=6, n_test=4), out / "world")
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(60)]
    processor = StudentProcessor.create(train_tokenizer([i.question for i in items] + [i.answer for i in items], 400),
                                        64, 8, 2)
    policy, ref = build_student(ModelConfig(), processor, seed=0), build_student(ModelConfig(), processor, seed=0)
    torch.manual_seed(1)
    disc = Discriminator(copy.deepcopy(policy.model))
    rows = load_rows(out / "world" / "rl.parquet")
    answers = {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}.")] * 2 for r in rows}
    ckpt = out / "rl"
    prepare_out_dir(ckpt, fingerprint(CFG, 0), CFG.steps)
    # the delay only stretches the run so the test can kill it between saves; it never touches the maths
    run_rl(policy, ref, processor, RLInputs(rows, answers, disc), CFG, ckpt, seed=0,
           state_dir=ckpt / STATE, on_log=lambda s, m: time.sleep(step_delay))
    save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, str(out / "final.safetensors"))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--step-delay", type=float, default=0.0)
    a = ap.parse_args()
    main(a.out, a.step_delay)
