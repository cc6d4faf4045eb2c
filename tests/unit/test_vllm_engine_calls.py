"""How the vLLM generator drives its engine, checked with a recording engine (vLLM itself runs in
test_vllm_backend.py, on the CPU, where neither seeds nor sleep mode apply): a seed of its own for every prompt,
images sent as RGB beside unexpanded prompts, and the sleep cycle of an RL step (level 2: weights and KV cache
released; woken weights first, the new weights loaded, then the KV cache)."""
import sys
import types

import pytest
import torch
from PIL import Image

from protege.generation import vllm_backend
from protege.generation.transformers_backend import Sampling
from protege.generation.vllm_backend import VLLMGenerator, unpadded


class RecordingEngine:
    """vllm.LLM's methods the generator calls; `generate` answers every prompt with its own ids echoed."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.requests: list = []

    def generate(self, prompts, params, use_tqdm=False):
        self.requests.append((prompts, params))
        self.calls.append(("generate",))
        return [types.SimpleNamespace(prompt_token_ids=None, outputs=[
            types.SimpleNamespace(token_ids=[5, 6], logprobs=None) for _ in range(p.n)]) for p in params]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method, kwargs):
        list(kwargs["weights_iterator"])  # the weights are read while the engine holds only its weights' memory
        self.calls.append((method,))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` module whose SamplingParams records its arguments, on a machine that says it has CUDA."""
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_each_prompt_gets_its_own_seed_and_rgb_images(fake_vllm, tiny_processor):
    engine = RecordingEngine()
    gen = VLLMGenerator("unused", tiny_processor, seed=3, llm=engine)
    images = [Image.new("P", (64, 64), 7), Image.new("RGBA", (64, 64), (1, 2, 3, 255)), None]
    questions = ["How many shapes?", "What colour?", "Is it big?"]
    batch = tiny_processor.encode_prompts(questions, images)
    gen.sample(tiny_processor, batch, images, Sampling(do_sample=True, max_new_tokens=2), 4,
               prompt_ids=tiny_processor.engine_prompt_ids(questions, images))
    prompts, params = engine.requests[0]
    seeds = [p.seed for p in params]
    assert len(params) == 3 and len(set(seeds)) == 3 and all(p.n == 4 for p in params)
    assert [p["multi_modal_data"]["image"].mode for p in prompts[:2]] == ["RGB", "RGB"]
    assert "multi_modal_data" not in prompts[2]
    # unexpanded: the batch's image tokens are not what the engine is sent
    pad = tiny_processor.image_token_id
    assert [p["prompt_token_ids"].count(pad) for p in prompts] == [1, 1, 0]
    assert unpadded(batch)[2] == prompts[2]["prompt_token_ids"]
    with pytest.raises(ValueError, match="unexpanded ids"):
        gen.sample(tiny_processor, batch, images, Sampling(do_sample=True, max_new_tokens=2), 4)


def test_an_rl_step_sleeps_at_level_2_and_wakes_weights_before_the_kv_cache(fake_vllm, tiny_processor,
                                                                             tiny_student):
    engine = RecordingEngine()
    gen = VLLMGenerator("unused", tiny_processor, seed=0, llm=engine, sleep=True)
    batch = tiny_processor.encode_prompts(["How many shapes?"], [None])
    gen.sample(tiny_processor, batch, None, Sampling(do_sample=True, max_new_tokens=2), 2)
    gen.sleep()  # the update runs here
    with pytest.raises(RuntimeError, match="sync_weights"):  # its weights are gone until the next sync
        gen.sample(tiny_processor, batch, None, Sampling(do_sample=True, max_new_tokens=2), 2)
    gen.sync_weights(tiny_student)
    gen.sample(tiny_processor, batch, None, Sampling(do_sample=True, max_new_tokens=2), 2)
    assert engine.calls == [("generate",), ("sleep", 2), ("wake_up", ("weights",)), ("reload_weights",),
                            ("wake_up", ("kv_cache",)), ("reset_prefix_cache",), ("generate",)]


def test_engine_arguments_are_sized_for_the_work(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kw = vllm_backend.engine_kwargs(0.3, True, max_model_len=1200, images_per_prompt=2, logprobs=True)
    assert kw["max_model_len"] == 1200 and kw["limit_mm_per_prompt"] == {"image": 2}
    assert kw["max_num_batched_tokens"] == vllm_backend.BATCHED_TOKENS_FLOOR
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enable_sleep_mode"]
    assert vllm_backend.engine_kwargs(max_model_len=10 ** 6)["max_num_batched_tokens"] == \
        vllm_backend.BATCHED_TOKENS_CEILING
    assert "limit_mm_per_prompt" not in vllm_backend.engine_kwargs(max_model_len=64)  # a text-only model
    with pytest.raises(TypeError):
        vllm_backend.engine_kwargs(0.3)  # no engine without its context
