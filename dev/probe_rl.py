"""Probe: a short RL run from the project's SFT checkpoint with param overrides, then per-kind greedy
accuracy on the val split and a few answers (for tuning the default recipe; not a stage).
  python dev/probe_rl.py rl.algorithm=ril rl.lr=1e-4 rl.steps=40
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from probe_sft import per_kind  # noqa: E402

from protege.config import load_config  # noqa: E402
from protege.data.rows import load_rows  # noqa: E402
from protege.eval.accuracy import evaluate_rows  # noqa: E402
from protege.models.discriminator import Discriminator  # noqa: E402
from protege.models.student import load_student  # noqa: E402
from protege.paths import CURATED_RL, DISCRIMINATOR, SFT_MODEL, SPLIT_TABLES  # noqa: E402
from protege.rl.loop import RLInputs, run_rl  # noqa: E402
from protege.stages.rl import teacher_answers  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_config("params.yaml")
    over: dict = {}
    for arg in sys.argv[1:]:
        key, value = arg.split("=", 1)
        section, name = key.split(".")
        over.setdefault(section, {})[name] = value
    cfg = cfg.model_validate({**cfg.model_dump(), **{s: {**cfg.model_dump()[s], **v} for s, v in over.items()}})
    c = cfg.rl.model_copy(update={"eval_every": 0})
    root = Path(".")
    policy, proc = load_student(root / SFT_MODEL)
    ref, _ = load_student(root / SFT_MODEL)
    ril = c.algorithm == "ril"
    inputs = RLInputs(load_rows(root / CURATED_RL), teacher_answers(root) if ril else {},
                      Discriminator.load(root / DISCRIMINATOR) if ril else None)
    val = load_rows(root / SPLIT_TABLES["val"])
    hist = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        run_rl(policy, ref, proc, inputs, c, Path(tmp), cfg.seed, on_log=lambda s, m: hist.append(m))
    keys = [k for k in ("answer_reward_student", "similarity_reward_student", "kl", "entropy", "response_length")
            if k in hist[0]]
    q = max(1, len(hist) // 4)
    print(f"{c.algorithm} lr={c.lr} steps={c.steps}: {time.time() - t0:.0f} s; " + "  ".join(
        f"{k} {sum(h[k] for h in hist[:q]) / q:.3f}->{sum(h[k] for h in hist[-q:]) / q:.3f}" for k in keys))
    summary, items = evaluate_rows(policy, proc, val, 64, c.max_new_tokens)
    print(f"val accuracy {summary['accuracy']:.3f}")
    for k, v in per_kind(items).items():
        print(f"  {k:13s} acc {v['acc']:.2f} distinct {v['distinct']} {v['top']}")
    for it in items[:12]:
        print("   ", it["kind"], repr(it["reference"]), "->", repr(it["prediction"]))


if __name__ == "__main__":
    main()
