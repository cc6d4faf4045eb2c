"""One RIL step of the README recipe's settings on a 7B-width student truncated to 2 layers, on the CPU: the
peak resident memory measured per phase against `protege plan --device cpu`'s prediction for the rl stage.

The student: the embedded Qwen2-VL architecture at Qwen2.5-VL-7B's text widths (hidden 3584, MLP 18944, 28
query / 4 key-value heads, vocabulary 152,064, untied LM head), 2 decoder layers, bf16, written once as a
Hugging Face folder by a child process. The measured process then loads it the way the rl stage does (bf16,
gradient checkpointing, LoRA rank 128 / alpha 256 / dropout 0.05 on policy and discriminator, the policy its own
reference) and runs one `ril` step: Q questions x (4 samples + 4 cached teacher answers), N new tokens at most.

    .venv/bin/python benchmarks/rl_memory_7b.py [--questions 4] [--new-tokens 32] [--threads 2]

Prints one line per phase (the step's named phases: sample, score_old, rewards, reference, update, save) with
its peak resident set size, then one JSON line: plan parts and peak, the measured peak (ru_maxrss) and the
ratio plan / measured. The plan's activations are bounded by the micro-batch budget, not by the batch, so the
peak does not grow with the number of questions past the first micro-batch's rows (sampling's KV cache and
logits do: they are per sampled row).
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

HIDDEN, MLP, HEADS, KV_HEADS, VOCAB, LAYERS = 3584, 18944, 28, 4, 152_064, 2
GROUP = 4


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PhasePeaks:
    """The largest resident set size seen during each phase, sampled every 20 ms by a thread."""

    def __init__(self):
        self.phase, self.peaks, self.order = "set-up", {}, ["set-up"]
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while self.running:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss())
            time.sleep(0.02)

    def enter(self, phase: str):
        self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss())
        self.phase = phase
        if phase not in self.order:
            self.order.append(phase)

    def stop(self):
        self.enter("done")
        self.running = False
        self.thread.join()


def build(folder: Path) -> None:
    """The child: writes the 7B-width student, its processor and the world's rows (bf16 throughout, so the
    builder never holds a float32 copy)."""
    from protege.config import ModelConfig, WorldConfig
    from protege.models.processor import StudentProcessor
    from protege.models.student import tiny_config
    from protege.models.tokenizer import train_tokenizer
    from protege.world.generate import generate_world
    from protege.world.questions import make_item
    from protege.world.teachers import all_templates
    from transformers import GenerationConfig, Qwen2VLForConditionalGeneration

    generate_world(WorldConfig(n_train=8, n_rl=64, n_val=4, n_test=4), folder / "world")
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    texts = [i.question for i in items] + [i.answer for i in items] + all_templates() * 5
    processor = StudentProcessor.create(train_tokenizer(texts, 400), 64, 8, 2)
    config = tiny_config(ModelConfig(hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS,
                                     intermediate_size=MLP, initializer_range=0.02), processor)
    config.text_config.vocab_size = VOCAB
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = Qwen2VLForConditionalGeneration(config)
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # sampling keeps to the tokenizer's own tokens: every sampled id decodes
        model.get_output_embeddings().weight[len(processor.tokenizer):] = 0.0
    tok = processor.tokenizer
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None)
    model.save_pretrained(folder / "model", safe_serialization=True)
    processor.save_pretrained(folder / "model")


def recipe_config(questions: int, new_tokens: int):
    from protege.config import Config

    base = Config()
    lora = base.model.lora.model_copy(update={"rank": 128, "alpha": 256, "dropout": 0.05})
    model = base.model.model_copy(update={"dtype": "bfloat16", "gradient_checkpointing": True, "lora": lora})
    rl = base.rl.model_copy(update={"algorithm": "ril", "trainable": "lora", "disc_trainable": "lora",
                                    "questions_per_step": questions, "group_size": GROUP, "steps": 1,
                                    "max_new_tokens": new_tokens, "device": "cpu", "save_every": 100,
                                    "eval_every": 0})
    return base.model_copy(update={"model": model, "rl": rl})


def watch_phases(peaks: PhasePeaks) -> None:
    """Marks the step's phases by wrapping the functions `rl_step` calls by name."""
    import protege.rl.step as step
    from protege.rl.rollouts.questions import Questions

    def marked(name, fn):
        def call(*a, **k):
            peaks.enter(name)
            return fn(*a, **k)
        return call

    for name, phase in (("score_old", "score_old"), ("shape_rewards", "rewards"),
                        ("reference_logprobs", "reference"), ("update", "update"), ("save", "save")):
        setattr(step, name, marked(phase, getattr(step, name)))
    Questions.sample = marked("sample", Questions.sample)
    import protege.rl.step as step_module
    import protege.runtime.state as state

    step_module.save_student = marked("save: checkpoint", step_module.save_student)
    state.save_file = marked("save: state", state.save_file)
    Questions.rewards = marked("rewards", Questions.rewards)


def measure(folder: Path, questions: int, new_tokens: int, threads: int) -> dict:
    from protege.data.rows import load_rows
    from protege.models.discriminator import load_discriminator
    from protege.plan import Lengths, model_shape, plan_stages
    from protege.rl.loop import RLInputs, run_rl
    from protege.stages.student_model import load_model, with_lora
    from protege.world.teachers import scripted_answer

    torch.set_num_threads(threads)
    peaks = PhasePeaks()
    cfg = recipe_config(questions, new_tokens)
    rows = load_rows(folder / "world" / "rl.parquet")[:questions]
    answers = {r.id: [(style, scripted_answer(style, r.kind, r.answer, r.candidates, r.id, k, 0.0, 0))
                      for k in range(2) for style in ("concise", "verbose")] for r in rows}
    peaks.enter("load")
    policy, processor = load_model(cfg, folder / "model", torch.device("cpu"))
    policy = with_lora(cfg, policy, "lora")
    disc = load_discriminator(folder / "model", from_student=True, dtype="bfloat16", recompute=True,
                              lora=cfg.model.lora, device=torch.device("cpu"))
    watch_phases(peaks)
    t0 = time.perf_counter()
    logs: list[dict] = []
    run_rl(policy, None, processor, RLInputs(rows, answers, disc), cfg.rl, folder / "rl", seed=0,
           on_log=lambda s, m: logs.append(m))
    seconds = time.perf_counter() - t0
    peaks.stop()
    measured = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    qs, ims = [r.question for r in rows], [r.image for r in rows]
    prompt = int(processor.encode_pairs(qs, ims, [""] * len(rows))["attention_mask"].sum(dim=1).max())
    shape = model_shape(cfg, folder, folder / "model")
    [plan] = [p for p in plan_stages(cfg, shape, lengths=Lengths(prompt=prompt, answer=new_tokens),
                                     device_type="cpu") if p.stage == "rl"]
    for phase in peaks.order:
        print(f"{phase:>10}: peak RSS {peaks.peaks.get(phase, 0) / 2**30:6.2f} GiB", flush=True)
    return {"part": "rl_memory_7b", "questions": questions, "rows": questions * 2 * GROUP, "new_tokens": new_tokens,
            "params": shape.params, "seconds": round(seconds, 1), "micro_batches": logs[-1].get("micro_batches"),
            "phase_peaks_gib": {k: round(v / 2**30, 2) for k, v in peaks.peaks.items()},
            "plan_parts_mib": {k: round(v / 2**20, 1) for k, v in plan.parts.items()}, "plan_phase": plan.phase,
            "plan_peak_mib": round(plan.peak / 2**20, 1), "measured_peak_mib": round(measured / 2**20, 1),
            "ratio": round(plan.peak / measured, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--folder", type=Path, help="reuse (or write) the built student here")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_only:
        build(args.folder)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp)
        if not (folder / "model" / "config.json").exists():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--build-only", "--folder", str(folder)], check=True)
            print(f"built the 7B-width student in {time.perf_counter() - t0:.0f} s", flush=True)
        print(json.dumps(measure(folder, args.questions, args.new_tokens, args.threads)), flush=True)


if __name__ == "__main__":
    main()
