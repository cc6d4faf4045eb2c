"""Runs both RL loops over a matrix of settings on the tiny student and writes, per case, a digest of the final
weights and the logged metrics: run it on two versions of the code (PYTHONPATH) and compare the folders to show
a refactor changed no number.

    PYTHONPATH=<checkout> .venv/bin/python dev/loop_equivalence.py OUT [CASE ...]
    .venv/bin/python dev/loop_equivalence.py --compare OLD NEW

With STOP_AFTER=k and WORK=DIR in the environment, each run stops after step k keeping its state in DIR; a second
run with the same WORK resumes from it (to show one version's states resume in another).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import torch


def _digest(model) -> dict[str, str]:
    return {k: hashlib.sha256(v.detach().float().contiguous().numpy().tobytes()).hexdigest()[:16]
            for k, v in model.state_dict().items()}


def _fixtures(work: Path):
    from protege.config import ModelConfig, WorldConfig
    from protege.models.processor import StudentProcessor
    from protege.models.student import build_student
    from protege.models.tokenizer import train_tokenizer
    from protege.world.generate import generate_world
    from protege.world.questions import make_item
    from protege.world.teachers import all_templates

    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    texts = [i.question for i in items] + [i.answer for i in items] + all_templates() * 5
    processor = StudentProcessor.create(train_tokenizer(texts, 400), 64, 8, 2)
    generate_world(WorldConfig(n_train=48, n_rl=16, n_val=8, n_test=16), work / "world")
    return processor, lambda: build_student(ModelConfig(), processor, seed=0)


def _variety(questions, references, responses):
    return [len(set(r)) / 10 for r in responses]


class _VarietyEnv:
    def reset(self, seed):
        from protege.world.envs import make_env
        self.env, self.turn = make_env("grid", max_turns=2), 0
        self.obs = self.env.reset(seed)
        return self.obs

    def step(self, text):
        from protege.world.envs import StepResult
        self.turn += 1
        done = self.turn == 2
        return StepResult(None if done else self.obs, len(set(text)) / 10, done,
                          {"legal": bool(text), "success": len(set(text)) > 8})


QUESTION = {
    "dr_grpo": dict(algorithm="dr_grpo"),
    "grpo_micro": dict(algorithm="grpo", micro_batch_tokens=40),
    "ril": dict(algorithm="ril", similarity="continuous"),
    "ril_fixed_nokl": dict(algorithm="ril", discriminator="fixed", kl_beta=0.0, teacher_in_group=False),
    "curve": dict(algorithm="dr_grpo", eval_every=1),
}
AGENT = {
    "grpo_gtr_kl": dict(algorithm="grpo", gtr={"guidance": "kl", "merge": "average"}),
    "gtpo": dict(algorithm="gtpo"),
    "dr_grpo_micro": dict(algorithm="dr_grpo", micro_batch_tokens=40, kl_beta=0.0),
    "ppo_sft": dict(algorithm="ppo", ppo={"epochs": 2}, gtr={"guidance": "sft", "merge": "average"}),
    "ppo_rl4vlm": dict(algorithm="ppo", kl_beta=0.0, temperature=0.5, ppo={"objective": "rl4vlm", "epochs": 2},
                       gtr={"guidance": "kl", "merge": "average"}, eval_every=2),
    "ppo_cosine": dict(algorithm="ppo", schedule="cosine", warmup_steps=1, gtr={"guidance": "kl", "merge": "ema"}),
}


STOP_AFTER = int(os.environ["STOP_AFTER"]) if os.environ.get("STOP_AFTER") else None


def run_case(name: str, work: Path, processor, student) -> dict:
    from protege.config import AgentConfig, RLConfig
    from protege.data.rows import load_rows
    logs: list = []
    on_log = lambda s, m: logs.append({k: float(v) for k, v in m.items() if not k.endswith("_s") and "per_s" not in k})
    out = work / name
    if name.startswith("q_"):
        from protege.models.discriminator import Discriminator
        from protege.rl.loop import RLInputs, run_rl
        rows = load_rows(work / "world" / "rl.parquet")[:6]
        answers = {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}.")] * 2 for r in rows}
        policy = student()
        torch.manual_seed(1)
        disc = Discriminator(copy.deepcopy(policy.model))
        torch.nn.init.normal_(disc.head.weight, std=0.5)
        cfg = RLConfig(steps=3, questions_per_step=3, group_size=2, max_new_tokens=4, save_every=2, lr=1e-3,
                       **QUESTION[name[2:]])
        curve: list = []
        evaluator = (lambda step, p: curve.append([step, float(sum(x.float().sum() for x in p.parameters()))]))
        run_rl(policy, copy.deepcopy(policy), processor, RLInputs(rows, answers, disc, judge=_variety,
                                                                  evaluator=evaluator), cfg, out, seed=0,
               on_log=on_log, state_dir=out / "state", stop_after=STOP_AFTER)
        return {"weights": _digest(policy), "logs": logs, "curve": curve}
    from protege.rl.agent_loop import run_agent_rl
    rl = {"steps": 3, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6, "save_every": 1, "lr": 1e-3,
          "schedule": "constant", **AGENT[name[2:]]}
    cfg = AgentConfig.model_validate({"grid": {"max_turns": 2}, "rl": rl, "eval_episodes": 2})
    policy = student()
    run_agent_rl(policy, processor, cfg, 64, out, seed=0, on_log=on_log, state_dir=out / "state",
                 new_env=_VarietyEnv, stop_after=STOP_AFTER)
    return {"weights": _digest(policy), "logs": logs}


def compare(old: Path, new: Path) -> int:
    bad = 0
    for f in sorted(old.glob("*.json")):
        a, b = json.loads(f.read_text()), json.loads((new / f.name).read_text())
        same_w = a["weights"] == b["weights"]
        keys = [k for k in a["logs"][0] if all(k in m for m in b["logs"])] if a["logs"] else []
        diff = sorted({k for m, n in zip(a["logs"], b["logs"]) for k in keys if m[k] != n[k]})
        renamed = sorted(set(a["logs"][0]) - set(b["logs"][0])) if a["logs"] else []
        print(f"{f.stem:24s} weights {'same' if same_w else 'DIFFER'}; metrics differing: {diff or 'none'}; "
              f"old names missing: {renamed or 'none'}; curve {'same' if a.get('curve') == b.get('curve') else 'DIFFER'}")
        bad += (not same_w) or bool(diff) or a.get("curve") != b.get("curve")
    return bad


def main() -> None:
    if sys.argv[1] == "--compare":
        sys.exit(1 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cases = sys.argv[2:] or [f"q_{k}" for k in QUESTION] + [f"a_{k}" for k in AGENT]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(os.environ.get("WORK") or tmp)
        processor, student = _fixtures(work)
        for name in cases:
            (out / f"{name}.json").write_text(json.dumps(run_case(name, work, processor, student)))
            print(name, "done", flush=True)


if __name__ == "__main__":
    main()
