"""Probe: a short RL run from the project's SFT checkpoint with param overrides, then per-kind greedy
accuracy on the val split and a few answers (for tuning the default recipe; not a stage).
  python dev/probe_rl.py rl.algorithm=ril rl.lr=1e-4 rl.steps=40
PROBE_SPLIT=test scores the test split instead; either way paired against the SFT checkpoint (its answers
cached under /tmp, keyed by the checkpoint's folder and time). PROBE_KINDS=count,yes_no trains on those
question kinds only.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from probe_sft import per_kind  # noqa: E402

from protege.config import load_config  # noqa: E402
from protege.data.rows import load_rows, read_table  # noqa: E402
from protege.eval.accuracy import evaluate_rows  # noqa: E402
from protege.eval.stats import paired_bootstrap  # noqa: E402
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
    pool = load_rows(root / CURATED_RL)
    if kinds := os.environ.get("PROBE_KINDS"):  # train on these question kinds only
        pool = [r for r in pool if r.kind in kinds.split(",")]
    inputs = RLInputs(pool, teacher_answers(root) if ril else {},
                      Discriminator.load(root / DISCRIMINATOR) if ril else None)
    split = os.environ.get("PROBE_SPLIT", "val")
    val = load_rows(root / SPLIT_TABLES[split])
    sft_file = (root / SFT_MODEL / "model.safetensors").resolve()
    key = hashlib.sha256(f"{sft_file}:{sft_file.stat().st_mtime_ns}:{split}".encode()).hexdigest()[:16]
    cache = Path(f"/tmp/probe_sft_{key}.json")
    if not cache.exists():
        _, sft_items = evaluate_rows(ref, proc, val, 64, c.max_new_tokens)
        cache.write_text(json.dumps(sft_items))
    sft_items = json.loads(cache.read_text())
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
    pd_ = paired_bootstrap({i["id"]: i["correct"] for i in sft_items}, {i["id"]: i["correct"] for i in items})
    print(f"{split} accuracy {summary['accuracy']:.3f}  (sft {pd_['a'] / 100:.3f}; rl - sft {pd_['diff']:+.2f} "
          f"[{pd_['ci'][0]:+.2f}, {pd_['ci'][1]:+.2f}])")
    base = per_kind(sft_items)
    for k, v in per_kind(items).items():
        print(f"  {k:13s} acc {base[k]['acc']:.2f} -> {v['acc']:.2f} distinct {v['distinct']} {v['top']}")
    fam = dict(zip(*[read_table(root / SPLIT_TABLES[split])[col] for col in ("id", "family")]))
    for f in sorted(set(fam.values())):
        a = [i["correct"] for i in sft_items if fam[i["id"]] == f]
        b = [i["correct"] for i in items if fam[i["id"]] == f]
        print(f"  family {f:12s} n {len(a):4d} sft {sum(a) / len(a):.2f} -> rl {sum(b) / len(b):.2f}")
    for it in items[:6]:
        print("   ", it["kind"], repr(it["reference"]), "->", repr(it["prediction"]))


if __name__ == "__main__":
    main()
