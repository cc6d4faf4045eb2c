"""`generation: vllm` wiring, without vLLM: an engine stand-in that samples with its own copy of the weights,
kept current only through `sync_weights`, must reproduce the transformers run exactly. A missed or late sync,
prompts or images not handed over, or an engine left open would all show here. (The real engine is checked
against transformers in test_vllm_backend.py.)"""
import copy

import pytest
import torch

from protege.config import EvaluateConfig, RLConfig, RolloutsConfig
from protege.data.rows import load_rows
from protege.generation import vllm_backend
from protege.generation.transformers_backend import Sampling, generate_answers, sample
from protege.rl.loop import RLInputs, run_rl

BASE = dict(steps=3, questions_per_step=2, group_size=2, max_new_tokens=4, save_every=10, lr=1e-2, device="cpu")


class CopyEngine:
    """What VLLMGenerator promises: completions from a copy of the weights it was started with or last sent."""

    def __init__(self, model, processor, seed=0, **engine_kw):
        self.model = copy.deepcopy(model)
        self.engine_kw, self.syncs, self.images_seen, self.closed = engine_kw, 0, [], False
        self.prompt_ids = []

    def sample(self, processor, batch, images, sampling, num_return_sequences=1, prompt_ids=None, row_seeds=None):
        self.images_seen += list(images)
        self.prompt_ids += prompt_ids or []
        return sample(self.model, processor, batch, sampling, num_return_sequences, row_seeds, images)

    def sync_weights(self, model):
        self.model.load_state_dict(model.state_dict())
        self.syncs += 1

    def close(self):
        self.closed = True


@pytest.fixture
def engines(monkeypatch):
    started = []

    def start(model, processor, seed=0, **kw):
        started.append(CopyEngine(model, processor, seed, **kw))
        return started[-1]

    monkeypatch.setattr(vllm_backend, "generator_from_model", start)
    return started


def test_vllm_rollouts_follow_the_policy_through_syncs(tiny_student, tiny_processor, tiny_world, tmp_path, engines):
    rows = load_rows(tiny_world / "rl.parquet")[:6]
    runs = {}
    for generation in ("transformers", "vllm"):
        policy = copy.deepcopy(tiny_student)
        logs = []
        # a judge that tells samples apart from the first step (the untrained student is never right)
        judge = lambda qs, refs, texts: [float(len(t) % 2) for t in texts]  # noqa: E731
        run_rl(policy, copy.deepcopy(tiny_student), tiny_processor, RLInputs(rows, judge=judge, max_prompt_tokens=120),
               RLConfig(**BASE, algorithm="dr_grpo", generation=generation, vllm_memory=0.25), tmp_path / generation, seed=0,
               on_log=lambda s, m: logs.append(m))
        runs[generation] = (policy.state_dict(), logs)
    [engine] = engines
    # the engine sleeps through updates and reports its log-probs for the importance weights (rl defaults)
    assert engine.syncs == 3 and engine.closed
    # sized for the questions (their cap + max_new_tokens, the most images one holds), not the model's context
    most = max(len(tiny_processor.image_lists([r.image])[0]) for r in rows)
    assert engine.engine_kw == {"memory": 0.25, "sleep": True, "logprobs": True, "max_model_len": 124,
                                "images_per_prompt": most}
    assert len(engine.images_seen) == 6 and all(im is not None for im in engine.images_seen)  # the pictures
    # and each prompt unexpanded: one image placeholder where the trainer's ids hold the image's tokens
    pad = tiny_processor.image_token_id
    n_images = [len(tiny_processor.image_lists([r.image])[0]) for r in rows]
    assert sorted(ids.count(pad) for ids in engine.prompt_ids) == sorted(n_images)
    (w_t, logs_t), (w_v, logs_v) = runs["transformers"], runs["vllm"]
    assert any(not torch.equal(w_t[k], tiny_student.state_dict()[k]) for k in w_t)  # the run did learn
    assert all(torch.equal(w_t[k], w_v[k]) for k in w_t)  # same samples, same updates
    assert [m["reward"] for m in logs_t] == [m["reward"] for m in logs_v]
    assert {"rollout_tokens_per_s", "update_s"} <= set(logs_v[0])


def test_generate_answers_takes_an_engine(tiny_student, tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "test.parquet")[:5]
    engine = CopyEngine(tiny_student, tiny_processor)
    greedy = Sampling(do_sample=False, max_new_tokens=6)
    args = ([r.question for r in rows], [r.image for r in rows], greedy)
    assert generate_answers(engine, tiny_processor, *args, batch_size=2)[:2] == \
        generate_answers(tiny_student, tiny_processor, *args, batch_size=2)[:2]
    assert len(engine.images_seen) == 5


def test_generation_keys_default_to_transformers():
    assert RLConfig().generation == RolloutsConfig().generation == EvaluateConfig().generation == "transformers"
    with pytest.raises(ValueError):
        RLConfig(generation="sglang")


def test_missing_vllm_says_how_to_get_it(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_vllm(name, *a, **kw):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(RuntimeError, match="protege\\[gpu\\]"):
        vllm_backend.require_vllm()


def test_benchmark_answers_take_an_engine(tiny_student, tiny_processor):
    """Evaluation's path (`evaluate.generation: vllm`): the engine gets each item's decoded pictures, two for
    BLINK, and its answers land on the right items."""
    from protege.eval.runner import generate_predictions
    from protege.world.benchmarks import make_mini_benchmark

    items = [it for name in ("ai2d", "blink") for it in make_mini_benchmark(name, 5, 64, 4, set())]
    engine = CopyEngine(tiny_student, tiny_processor)
    by_engine = generate_predictions(engine, tiny_processor, items, batch_size=3, max_new_tokens=5)
    by_model = generate_predictions(tiny_student, tiny_processor, items, batch_size=3, max_new_tokens=5)
    assert [(p.index, p.text, p.tokens) for p in by_engine] == [(p.index, p.text, p.tokens) for p in by_model]
    assert sorted(map(len, engine.images_seen)) == sorted(len(it.images) for it in items)


def test_an_engine_samples_without_gathering_the_policy(tiny_student, tiny_processor, tiny_world, tmp_path, engines,
                                                        monkeypatch):
    """Under ZeRO-3 a gather assembles the whole policy on every rank (a collective): an engine that samples from
    its own copy of the weights needs none, so its rollouts are taken outside one; the policy's own are inside."""
    import contextlib

    from protege.runtime import updaters

    depth = {"now": 0}
    seen = []

    @contextlib.contextmanager
    def counting(self, modifier_rank=None):
        depth["now"] += 1
        try:
            yield
        finally:
            depth["now"] -= 1

    monkeypatch.setattr(updaters.TorchUpdater, "gathered", counting)
    real_sample = CopyEngine.sample
    monkeypatch.setattr(CopyEngine, "sample", lambda self, *a, **kw: (seen.append(depth["now"]),
                                                                      real_sample(self, *a, **kw))[1])
    rows = load_rows(tiny_world / "rl.parquet")[:4]
    judge = lambda qs, refs, texts: [float(len(t) % 2) for t in texts]  # noqa: E731
    run_rl(copy.deepcopy(tiny_student), copy.deepcopy(tiny_student), tiny_processor,
           RLInputs(rows, judge=judge, max_prompt_tokens=120),
           RLConfig(**{**BASE, "steps": 2}, algorithm="dr_grpo", generation="vllm"), tmp_path / "v", seed=0)
    assert seen == [0, 0]  # two steps' rollouts, neither inside a gather

    from protege.generation import transformers_backend

    inside = []
    real = transformers_backend.sample
    monkeypatch.setattr(transformers_backend, "sample", lambda *a, **kw: (inside.append(depth["now"]), real(*a, **kw))[1])
    run_rl(copy.deepcopy(tiny_student), copy.deepcopy(tiny_student), tiny_processor,
           RLInputs(rows, judge=judge, max_prompt_tokens=120),
           RLConfig(**{**BASE, "steps": 2}, algorithm="dr_grpo"), tmp_path / "t", seed=0)
    assert inside and all(d >= 1 for d in inside)  # the policy samples with its weights whole


def test_the_learning_curve_is_answered_by_the_awake_engine(tiny_student, tiny_processor, tiny_world, tmp_path,
                                                            engines):
    """Where an engine samples, the curve's greedy answers come from it, holding the step's weights (synced
    after the update), not from transformers' generate on the policy; and greedy calls draw no seed."""
    rows = load_rows(tiny_world / "rl.parquet")[:4]
    policy, seen = copy.deepcopy(tiny_student), []

    def evaluator(step, model):
        greedy = Sampling(do_sample=False, max_new_tokens=4)
        args = ([r.question for r in rows[:2]], [r.image for r in rows[:2]], greedy, 2)
        seen.append((step, model, generate_answers(model, tiny_processor, *args)[0],
                     generate_answers(policy, tiny_processor, *args)[0]))

    inputs = RLInputs(rows, evaluator=evaluator, max_prompt_tokens=120)
    run_rl(policy, copy.deepcopy(tiny_student), tiny_processor, inputs,
           RLConfig(**{**BASE, "steps": 2}, algorithm="dr_grpo", generation="vllm", eval_every=1), tmp_path, seed=0)
    [engine] = engines
    assert [step for step, *_ in seen] == [0, 1, 2]
    assert all(model is engine for _, model, *_ in seen)
    assert all(by_engine == by_policy for *_, by_engine, by_policy in seen)  # the same weights answer
