"""One rank of a DeepSpeed multi-turn (agent) RL run with PPO's value head on the tiny model (launched by
test_agent_deepspeed.py). The policy samples with top_k 1 (and the merged teacher with teacher_top_k 1): every
episode is then the same whichever rank plays it, so a run on several ranks can be compared with one process.
Writes rank<r><tag>.json (what ran, a digest of the policy and value head) and, on rank 0, final<tag>.safetensors
(the policy as `policy.*` and the value head as `value_head.*`, from the run's last training state)."""
import argparse
import faulthandler
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def config(steps: int, zero_stage: int, guidance: str, micro: int | None, warmup: int = 1,
           objective: str = "token"):
    from protege.config import AgentConfig

    return AgentConfig.model_validate({
        "context": "full",
        "grid": {"max_turns": 2},
        "rl": {"steps": steps, "seeds_per_step": 3, "group_size": 2, "max_new_tokens": 6, "save_every": 1,
               "lr": 1e-3, "top_k": 1, "backend": "deepspeed", "zero_stage": zero_stage,
               "micro_batch_tokens": micro,
               # the section's defaults otherwise (algorithm ppo, a cosine rate, the KL guidance); the value head
               # fits alone for the first step only, so the policy is updated in the others
               "ppo": {"value_warmup_steps": warmup, "objective": objective},
               "gtr": {"guidance": guidance, "teacher_top_k": 1, "sft_contexts": 3}},
        "eval_episodes": 4})


def main(out: str, zero_stage: int, steps: int, stop_after: int | None, tag: str, guidance: str,
         micro: int | None, warmup: int, objective: str) -> None:
    import protege.rl.agent_loop as agent_loop

    own_rule = agent_loop.action_start_for
    if guidance == "sft":
        # the untrained merged teacher never writes the grid game's action, so it would teach nothing: here any
        # output's first half is its thought and the rest its action (this run only: a process runs several)
        agent_loop.action_start_for = lambda cfg: (lambda text: len(text) // 2 if len(text) > 1 else None)
    try:
        run(out, zero_stage, steps, stop_after, tag, guidance, micro, warmup, objective)
    finally:
        agent_loop.action_start_for = own_rule


def run(out: str, zero_stage: int, steps: int, stop_after: int | None, tag: str, guidance: str,
        micro: int | None, warmup: int, objective: str) -> None:
    from protege.config import ModelConfig
    from protege.models.student import build_student
    from protege.rl.agent_loop import run_agent_rl
    from tests.conftest import tiny_processor
    from tests.stages.test_agent_rl import VarietyEnv

    faulthandler.dump_traceback_later(400, exit=True)  # a rank stuck in a collective says where, then ends
    rank = int(os.environ.get("RANK", 0))
    out_dir = Path(out)
    processor = tiny_processor.__wrapped__()
    student = build_student(ModelConfig(), processor, seed=0)
    cfg = config(steps, zero_stage, guidance, micro, warmup, objective)
    assert cfg.rl.algorithm == "ppo" and cfg.rl.gtr.guidance == guidance
    logs = []
    ckpt = out_dir / f"ckpt{tag}"
    run_agent_rl(student, processor, cfg, 64, ckpt, seed=0, on_log=lambda s, m: logs.append(m),
                 state_dir=ckpt / "state", stop_after=stop_after, new_env=VarietyEnv)
    torch.distributed.barrier()  # rank 0 has renamed the last state into place
    state = ckpt / "state"
    final = {**{f"policy.{k}": v for k, v in load_file(str(state / "policy.safetensors")).items()},
             **{f"value_head.{k}": v for k, v in load_file(str(state / "value_head.safetensors")).items()}}
    digest = hashlib.sha256(b"".join(final[k].numpy().tobytes() for k in sorted(final))).hexdigest()
    (out_dir / f"rank{rank}{tag}.json").write_text(json.dumps({
        "steps": len(logs), "digest": digest, "logs": logs if rank == 0 else [],
        "step": json.loads((state / "state.json").read_text())["step"]}))
    if rank == 0:
        save_file(final, str(out_dir / f"final{tag}.safetensors"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("zero_stage", type=int)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--stop-after", type=int)
    ap.add_argument("--tag", default="", help="suffix of this run's output files")
    ap.add_argument("--guidance", default="kl")
    ap.add_argument("--micro", type=int, help="micro_batch_tokens (default: derived)")
    ap.add_argument("--warmup", type=int, default=1, help="ppo.value_warmup_steps")
    ap.add_argument("--objective", default="token", help="ppo.objective")
    return ap


if __name__ == "__main__":
    # several runs, one after another in this process, separated by "--next": each pays the ~8 s of imports
    # and DeepSpeed set-up once, not once a run; every run seeds itself and keeps its state in its own files
    jobs, job = [], []
    for arg in sys.argv[1:]:
        if arg == "--next":
            jobs.append(job)
            job = []
        else:
            job.append(arg)
    for args in jobs + [job]:
        a = parser().parse_args(args)
        main(a.out, a.zero_stage, a.steps, a.stop_after, a.tag, a.guidance, a.micro, a.warmup, a.objective)
