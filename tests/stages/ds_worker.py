"""One rank of a DeepSpeed RL run on the tiny world (launched by test_deepspeed.py)."""
import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from protege.config import ModelConfig, RLConfig, WorldConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.processor import StudentProcessor
from protege.models.student import build_student
from protege.models.tokenizer import train_tokenizer
from protege.rl.loop import RLInputs, run_rl
from protege.world.generate import generate_world
from protege.world.questions import make_item


def agent(out_dir: Path, zero_stage: int, steps: int, tag: str) -> None:
    """The multi-turn loop with GTR-Turbo's KL guidance, its policy updated by DeepSpeed."""
    from protege.rl.agent_loop import run_agent_rl
    from tests.conftest import tiny_processor
    from tests.stages.test_agent_rl import VarietyEnv, tiny_cfg

    processor = tiny_processor.__wrapped__()
    student = build_student(ModelConfig(), processor, seed=0)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    base = tiny_cfg()
    cfg = base.model_copy(update={"rl": base.rl.model_copy(update={"steps": steps, "backend": "deepspeed",
                                                                   "zero_stage": zero_stage})})
    logs = []
    saved = run_agent_rl(student, processor, cfg, 64, out_dir / f"ckpt{tag}", seed=0,
                         on_log=lambda s, m: logs.append(m), new_env=VarietyEnv)
    from safetensors.torch import load_file

    final = load_file(str(saved[-1] / "model.safetensors"))
    changed = sorted(k for k in final if k in before and not torch.equal(final[k], before[k]))
    (out_dir / f"rank0{tag}.json").write_text(json.dumps({"changed": len(changed), "steps": len(logs),
                                                          "saved": [p.name for p in saved],
                                                          "teacher": (saved[-1].parent / "merged-teacher").is_dir()}))


def main(out: str, algorithm: str, zero_stage: int, steps: int = 2, stop_after: int | None = None,
         state: bool = False, tag: str = "", micro: int | None = None, settings: dict | None = None) -> None:
    out_dir = Path(out)
    if algorithm == "agent":
        return agent(out_dir, zero_stage, steps, tag)
    rank = int(__import__("os").environ.get("RANK", 0))
    world_dir = out_dir / f"world-{rank}"
    generate_world(WorldConfig(n_train=16, n_rl=8, n_test=4), world_dir)
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    processor = StudentProcessor.create(train_tokenizer([i.question for i in items] + [i.answer for i in items], 400),
                                        64, 8, 2)
    student = build_student(ModelConfig(), processor, seed=0)
    ref = build_student(ModelConfig(), processor, seed=0)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    rows = load_rows(world_dir / "rl.parquet")
    answers = {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}.")] for r in rows}
    torch.manual_seed(1)
    disc = Discriminator(build_student(ModelConfig(), processor, seed=0).model) if algorithm == "ril" else None
    cfg = RLConfig(algorithm=algorithm, steps=steps, questions_per_step=2, group_size=2, max_new_tokens=4, lr=1e-3,
                   save_every=2, backend="deepspeed", zero_stage=zero_stage, micro_batch_tokens=micro,
                   **(settings or {}))
    logs = []
    ckpt = out_dir / f"ckpt{tag}"
    run_rl(student, ref, processor, RLInputs(rows, answers, disc), cfg, ckpt, seed=0,
           on_log=lambda s, m: logs.append(m), state_dir=ckpt / "state" if state else None, stop_after=stop_after)
    with torch.no_grad():
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(student.parameters())) if zero_stage == 3 else _null():
            state = {k: v.clone() for k, v in student.state_dict().items()}
    digest = hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state))).hexdigest()
    changed = sorted(k for k in state if state[k].shape == before[k].shape and not torch.equal(state[k], before[k]))
    (out_dir / f"rank{rank}{tag}.json").write_text(json.dumps({"digest": digest, "changed": len(changed),
                                                               "steps": len(logs)}))
    if rank == 0:
        save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / f"final{tag}.safetensors"))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("algorithm")
    ap.add_argument("zero_stage", type=int)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--state", action="store_true", help="save / resume the full training state")
    ap.add_argument("--tag", default="", help="suffix of this run's output files")
    ap.add_argument("--micro", type=int, help="micro_batch_tokens (default: derived)")
    ap.add_argument("--settings", type=json.loads, default={}, help="more rl settings, as JSON")
    return ap


if __name__ == "__main__":
    # several runs, one after another in this process, separated by "--next": each pays the ~8 s of imports
    # and DeepSpeed set-up once, not once a run; every run seeds itself and keeps its state in its own files
    jobs = [[]]
    for arg in sys.argv[1:]:
        if arg == "--next":
            jobs.append([])
        else:
            jobs[-1].append(arg)
    for args in jobs:
        a = parser().parse_args(args)
        main(a.out, a.algorithm, a.zero_stage, a.steps, a.stop_after, a.state, a.tag, a.micro, a.settings)
