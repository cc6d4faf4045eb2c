"""Every VLM family through every stage's code, as a user's own checkpoint folder would go.

Each family of tests/families.py (a tiny random checkpoint saved with its real processor class and a chat
template in its style) goes sft -> curate -> disc_pretrain -> rl (ril) -> merge -> evaluate, plus one agent
RL step (and one tool RL step where bubblewrap is installed). Every run checks that losses are finite, that
trained parameters moved and frozen ones did not, that saved checkpoints reload with plain
AutoModelForImageTextToText, that batched greedy generation equals one prompt at a time, and that the
training forward's log-probs equal a plain forward's.
"""
import copy

import pytest
import torch
from transformers import AutoModelForImageTextToText

from protege.config import AgentConfig, DiscPretrainConfig, RLConfig, SFTConfig, ToolConfig
from protege.data.curate import answer_logprobs
from protege.data.rows import load_rows
from protege.generation.transformers_backend import Sampling, generate_answers, sample
from protege.merging.config import parse_config
from protege.merging.streaming import merge_folders
from protege.models.discriminator import Discriminator
from protege.models.student import load_student, save_student
from protege.rl.agent_loop import run_agent_rl
from protege.rollout.trajectory import from_completions, token_logprobs
from protege.rl.loop import RLInputs, run_rl
from protege.train.disc_pretrain import Example, pretrain_discriminator
from protege.train.sft import train_sft
from tests.families import FAMILIES, build_family
from tests.stages.test_agent_rl import VarietyEnv

GREEDY = Sampling(max_new_tokens=4)


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def moved(before: dict, model) -> set[str]:
    return {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}


def reloads_equal(folder, model) -> None:
    again = AutoModelForImageTextToText.from_pretrained(str(folder), use_safetensors=True)
    mine, theirs = model.state_dict(), again.state_dict()
    assert set(mine) == set(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def greedy_batched_equals_one_by_one(model, processor, rows) -> None:
    qs, ims = [r.question for r in rows], [r.image for r in rows]
    batched = sample(model, processor, processor.encode_prompts(qs, ims), GREEDY)
    for i, (q, im) in enumerate(zip(qs, ims)):
        one = sample(model, processor, processor.encode_prompts([q], [im]), GREEDY)
        n = int(one.completion_mask[0].sum())
        got = batched.sequences[i, batched.prompt_len:][:n]
        assert torch.equal(got, one.sequences[0, one.prompt_len:][:n]), (i, processor.tokenizer.decode(got))


def training_logprobs_equal_a_plain_forward(model, processor, rows) -> None:
    """The left-padded batch's log-probs (the RL update's forward) against each row alone, unpadded."""
    ims = [r.image for r in rows]
    prompts = processor.encode_prompts([r.question for r in rows], ims)
    c = sample(model, processor, prompts, Sampling(do_sample=True, max_new_tokens=5))
    with torch.no_grad():
        batched = token_logprobs(model, from_completions(c, processor.repeat_rows(prompts, ims, 1), processor))
        for i, r in enumerate(rows):
            keep = prompts["attention_mask"][i].bool()
            n = int(c.completion_mask[i].sum())
            ids = c.sequences[i, :c.prompt_len][keep].tolist() + c.sequences[i, c.prompt_len:][:n].tolist()
            images = r.image if isinstance(r.image, list) else [r.image]
            logits = model(**processor.assemble([ids], [images]), use_cache=False).logits[0].float()
            p = len(ids) - n
            plain = torch.log_softmax(logits[p - 1:-1], -1).gather(-1, torch.tensor(ids[p:]).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(batched[i, :n], plain, atol=2e-4), (i, batched[i, :n], plain)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_goes_through_every_stage(family, tmp_path, tiny_world):
    if family in ("smolvlm", "idefics3"):
        pytest.importorskip("num2words", reason="SmolVLM's processor imports num2words")
    base = build_family(family, tmp_path / "base")
    model, processor = load_student(base)
    train = [r for r in load_rows(tiny_world / "train.parquet") if not isinstance(r.image, list)][:12]
    rl_rows = load_rows(tiny_world / "rl.parquet")[:4]

    # sft: finite losses, every weight trainable moves; the checkpoint reloads with plain transformers
    before = state(model)
    logs = []
    # with a resume state every step: tied weights (Gemma's embeddings and LM head) are saved as well
    train_sft(model, processor, train, SFTConfig(steps=3, batch_size=4, lr=3e-3, warmup_steps=0, log_every=1, save_every=1), seed=0,
              on_log=lambda s, m: logs.append(m), state_dir=tmp_path / "sft_state")
    assert logs and all(torch.isfinite(torch.tensor(m["loss"])) for m in logs)
    assert moved(before, model)
    save_student(model, processor, tmp_path / "sft")
    reloads_equal(tmp_path / "sft", model)
    greedy_batched_equals_one_by_one(model, processor, train[:3])
    training_logprobs_equal_a_plain_forward(model, processor, train[:3])

    # curate: log-prob scoring and token lengths
    lp = answer_logprobs(model, processor, train[:4], batch_size=2)
    assert len(lp) == 4 and all(x <= 0 and x == x for x in lp)
    assert processor.token_length(train[0].question, train[0].answer, train[0].image) > len(train[0].answer)

    # disc_pretrain: the family's base model + a head, saved and reloaded as a folder
    disc = Discriminator.from_student(tmp_path / "sft")
    examples = [Example(r.id, r.question, r.image, a, label) for r in train[:6]
                for a, label in ((r.answer, 1.0), (f"The answer is {r.answer}.", 0.0))]
    result = pretrain_discriminator(disc, processor, examples, DiscPretrainConfig(steps=2, batch_size=4), seed=0)
    assert 0 <= result["heldout_accuracy"] <= 1
    disc.save(tmp_path / "disc")
    again = Discriminator.load(tmp_path / "disc")
    batch = processor.encode_pairs([r.question for r in train[:2]], [r.image for r in train[:2]], ["1", "2"])
    with torch.no_grad():
        assert torch.allclose(disc.eval()(**batch), again.eval()(**batch), atol=1e-5)

    # rl (ril): policy and discriminator train; the default group leaves the MLPs alone
    before = state(model)
    answers = {r.id: [("concise", f"{r.answer}."), ("verbose", f"The answer is {r.answer}.")] for r in rl_rows}
    rl_logs = []
    saved = run_rl(model, copy.deepcopy(model), processor, RLInputs(rl_rows, answers, disc),
                   RLConfig(steps=2, questions_per_step=2, group_size=2, max_new_tokens=4, save_every=1,
                            lr=1e-3, algorithm="ril"), tmp_path / "rl", seed=0, on_log=lambda s, m: rl_logs.append(m))
    assert len(rl_logs) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in rl_logs)
    changed = moved(before, model)
    assert any("lm_head" in k or "embed_tokens" in k or "self_attn" in k for k in changed)
    assert not any(".mlp." in k for k in changed), sorted(changed)
    reloads_equal(saved[-1], model)

    # merge: a linear soup of the RL checkpoints, with the processor's files carried along
    merge_folders(parse_config({"merge_method": "linear", "models": [{"model": str(p), "parameters": {"weight": 1.0}}
                                                                      for p in saved]}, source="test"),
                  tmp_path / "merged", overwrite=True)
    merged, merged_processor = load_student(tmp_path / "merged")

    # evaluate: batched greedy answers from the merged checkpoint
    texts, tokens, _ = generate_answers(merged, merged_processor, [r.question for r in rl_rows],
                                        [r.image for r in rl_rows], GREEDY, batch_size=2)
    assert len(texts) == 4 and all(0 < t <= 4 for t in tokens)

    # one agent RL step (multi-turn: each turn's observation rendered by the family's template)
    agent = AgentConfig.model_validate({"grid": {"max_turns": 2}, "rl": {"steps": 1, "seeds_per_step": 2,
                                                                          "group_size": 2, "max_new_tokens": 6,
                                                                          "save_every": 1, "lr": 1e-3,
                                                                          "algorithm": "grpo", "schedule": "constant",
                                                                          "gtr": {"guidance": "none"}}})
    a_logs = []
    run_agent_rl(merged, merged_processor, agent, 64, tmp_path / "agent", seed=0, on_log=lambda s, m: a_logs.append(m))
    assert len(a_logs) == 1 and torch.isfinite(torch.tensor(a_logs[0]["loss"]))


@pytest.mark.parametrize("family", ["gemma3", "smolvlm"])
def test_one_tool_rl_step(family, tmp_path):
    from protege.tools.sandbox import isolation_tool

    if isolation_tool() is None:
        pytest.skip("bubblewrap (bwrap) is not installed: the tool environment refuses to run model code")
    if family == "smolvlm":
        pytest.importorskip("num2words", reason="SmolVLM's processor imports num2words")
    model, processor = load_student(build_family(family, tmp_path / "base"))
    tool = ToolConfig.model_validate({"task": {"kinds": ["arithmetic"]},
                                      "rl": {"steps": 1, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 16,
                                             "save_every": 1, "lr": 1e-3, "algorithm": "grpo"},
                                      "sandbox": {"timeout_s": 2.0}})
    logs = []
    run_agent_rl(model, processor, tool, 64, tmp_path / "tool", seed=0, on_log=lambda s, m: logs.append(m))
    assert len(logs) == 1 and torch.isfinite(torch.tensor(logs[0]["loss"]))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "internvl"])
def test_lora_sft_then_ril_trains_only_adapters(family, tmp_path, tiny_world):
    """trainable lora: only the adapters move; the checkpoint holds merged full weights (plain transformers
    loads them and gives the adapted model's logits) and the adapter; RL's reference is the model with its
    adapters off, so the first step's KL is exactly 0."""
    from protege.models.lora import ADAPTER_DIR, add_lora, adapters_disabled

    model, processor = load_student(build_family(family, tmp_path / "base"))
    train = [r for r in load_rows(tiny_world / "train.parquet") if not isinstance(r.image, list)][:8]
    model = add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="auto")
    before = state(model)
    train_sft(model, processor, train, SFTConfig(steps=2, batch_size=4, lr=1e-2, warmup_steps=0), seed=0)
    changed = moved(before, model)
    assert changed and all(".lora_" in k for k in changed), sorted(changed)[:5]
    save_student(model, processor, tmp_path / "sft")
    assert (tmp_path / "sft" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    plain = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "sft"), use_safetensors=True)
    batch = processor.encode_prompts([r.question for r in train[:2]], [r.image for r in train[:2]])
    with torch.no_grad():
        assert torch.allclose(plain(**batch).logits, model(**batch).logits, atol=1e-4)
        with adapters_disabled(model):
            assert not torch.allclose(plain(**batch).logits, model(**batch).logits, atol=1e-4)

    policy, _ = load_student(tmp_path / "sft")
    policy = add_lora(policy, rank=4, alpha=8, dropout=0.0, target_modules="auto")
    before = state(policy)
    logs = []
    rows = load_rows(tiny_world / "rl.parquet")[:4]
    saved = run_rl(policy, None, processor, RLInputs(rows),
                   RLConfig(steps=2, questions_per_step=2, group_size=2, max_new_tokens=4, save_every=2, lr=1e-2,
                            trainable="lora", kl_beta=0.1, algorithm="dr_grpo"), tmp_path / "rl", seed=0, on_log=lambda s, m: logs.append(m))
    assert logs[0]["kl"] == 0.0 and all(torch.isfinite(torch.tensor(m["loss"])) for m in logs)
    assert all(".lora_" in k for k in moved(before, policy))
    reloads_as_merged = AutoModelForImageTextToText.from_pretrained(str(saved[-1]), use_safetensors=True)
    with torch.no_grad():
        assert torch.allclose(reloads_as_merged(**batch).logits, policy(**batch).logits, atol=1e-4)


def test_lora_targets_that_name_no_module_are_refused(tmp_path):
    from protege.errors import UserFacingError
    from protege.models.lora import add_lora

    model, _ = load_student(build_family("qwen2_vl", tmp_path / "base"))
    with pytest.raises(UserFacingError, match=r"model.lora.target_modules: \['qkv_proj'\] name no linear module of "
                                              r"Qwen2VLForConditionalGeneration; its linear modules end with"):
        add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "qkv_proj"])


def test_gradient_checkpointing_gives_the_same_update(tmp_path, tiny_world):
    """model.gradient_checkpointing recomputes activations in the backward pass: the same loss and weights."""
    from protege.config import Config
    from protege.stages.student_model import load_model

    folder = build_family("qwen2_5_vl", tmp_path / "base")
    train = [r for r in load_rows(tiny_world / "train.parquet") if not isinstance(r.image, list)][:8]
    results = []
    for checkpointing in (False, True):
        cfg = Config.model_validate({"model": {"gradient_checkpointing": checkpointing}})
        model, processor = load_model(cfg, folder)
        assert model.is_gradient_checkpointing == checkpointing
        logs = []
        train_sft(model, processor, train, SFTConfig(steps=2, batch_size=4, lr=1e-3, warmup_steps=0, log_every=1), seed=0,
                  on_log=lambda s, m: logs.append(m["loss"]))
        results.append((logs, state(model)))
    (loss_a, w_a), (loss_b, w_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert all(torch.allclose(w_a[k], w_b[k], atol=1e-6) for k in w_a)


@pytest.mark.parametrize("lora", [False, True])
def test_the_discriminator_recomputes_as_the_policy_does(tmp_path, tiny_world, lora):
    """model.gradient_checkpointing reaches the discriminator (with or without adapters): its backbone
    recomputes, its micro-batch budget counts on that, and its training is the same."""
    from protege.config import Config
    from protege.models.discriminator import load_discriminator
    from protege.models.recompute import recomputes
    from protege.runtime.micro import budget_tokens

    folder = build_family("qwen2_5_vl", tmp_path / "base")
    _, processor = load_student(folder)
    train = [r for r in load_rows(tiny_world / "train.parquet") if not isinstance(r.image, list)][:6]
    examples = [Example(r.id, r.question, r.image, a, label) for r in train
                for a, label in ((r.answer, 1.0), (f"The answer is {r.answer}.", 0.0))]
    adapters = Config.model_validate({"model": {"lora": {"rank": 4, "alpha": 8, "dropout": 0.0}}}).model.lora
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)  # the same fresh adapters in both
        disc = load_discriminator(folder, from_student=True, recompute=recompute, lora=adapters if lora else None)
        assert recomputes(disc) == recompute
        results.append((budget_tokens(None, disc), pretrain_discriminator(
            disc, processor, examples, DiscPretrainConfig(steps=2, batch_size=4, lr=1e-2), seed=0), state(disc)))
    (plain_budget, plain, w_a), (budget, again, w_b) = results
    assert budget > plain_budget  # each layer keeps its input only
    assert again["heldout_accuracy"] == plain["heldout_accuracy"]
    assert all(torch.allclose(w_a[k], w_b[k], atol=1e-6) for k in w_a)
    assert any(not torch.equal(w_a[k], v) for k, v in state(load_discriminator(folder, from_student=True,
                                                                              lora=adapters if lora else None)).items()
               if k.startswith("head."))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_lora_agent_rl_with_a_merged_teacher(family, tmp_path):
    """agent.rl.trainable lora: only adapters move; the KL reference is the policy with adapters off (the first
    step's KL is 0); GTR-Turbo's merged teacher is a plain model holding the merge of the adapted weights
    W + scale * B A: after two updates it is the mean of the two merged checkpoints (averaging the A and B
    factors apart would not give that)."""
    from protege.models.lora import add_lora, is_lora

    model, processor = load_student(build_family(family, tmp_path / "base"))
    policy = add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="auto")
    before = state(policy)
    agent = AgentConfig.model_validate({"grid": {"max_turns": 2}, "rl": {
        "steps": 2, "seeds_per_step": 2, "group_size": 2, "max_new_tokens": 6, "save_every": 1, "lr": 1e-2,
        "trainable": "lora", "kl_beta": 0.1, "gtr": {"guidance": "kl", "merge": "average"}, "algorithm": "grpo",
        "schedule": "constant"}})
    logs = []
    saved = run_agent_rl(policy, processor, agent, 64, tmp_path / "agent", seed=0, on_log=lambda s, m: logs.append(m),
                         new_env=VarietyEnv)  # rewards that differ within a group: the update is not zero
    assert logs[0]["kl"] == 0.0 and torch.isfinite(torch.tensor(logs[0]["loss"]))
    changed = moved(before, policy)
    assert changed and all(".lora_" in k for k in changed), sorted(changed)[:5]
    teacher = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "agent" / "merged-teacher"),
                                                          use_safetensors=True)
    assert not is_lora(teacher)
    assert len(saved) == 2
    c1, c2 = (AutoModelForImageTextToText.from_pretrained(str(p), use_safetensors=True).state_dict() for p in saved)
    mine = teacher.state_dict()
    assert any(not torch.equal(c1[k], c2[k]) for k in mine)
    assert all(torch.allclose(mine[k], (c1[k] + c2[k]) / 2, atol=1e-6) for k in mine)


def test_lora_discriminator_trains_adapters_and_head_and_saves_merged(tmp_path, tiny_world):
    from protege.config import Config
    from protege.models.lora import is_lora
    from protege.models.discriminator import load_discriminator

    base = build_family("qwen2_vl", tmp_path / "base")
    _, processor = load_student(base)
    train = [r for r in load_rows(tiny_world / "train.parquet") if not isinstance(r.image, list)][:6]
    cfg = Config.model_validate({"model": {"lora": {"rank": 4, "alpha": 8, "dropout": 0.0}}})
    disc = load_discriminator(base, from_student=True, lora=cfg.model.lora)
    assert is_lora(disc.backbone)
    before = state(disc)
    examples = [Example(r.id, r.question, r.image, a, label) for r in train
                for a, label in ((r.answer, 1.0), (f"The answer is {r.answer}.", 0.0))]
    pretrain_discriminator(disc, processor, examples, DiscPretrainConfig(steps=2, batch_size=4, lr=1e-2), seed=0)
    changed = moved(before, disc)
    assert any(k.startswith("head.") for k in changed)
    assert all(".lora_" in k or k.startswith("head.") for k in changed), sorted(changed)[:5]
    disc.save(tmp_path / "disc")
    again = Discriminator.load(tmp_path / "disc")
    assert not is_lora(again.backbone)
    batch = processor.encode_pairs([r.question for r in train[:2]], [r.image for r in train[:2]], ["1", "2"])
    with torch.no_grad():
        assert torch.allclose(disc.eval()(**batch), again.eval()(**batch), atol=1e-5)


def test_bfloat16_weights_and_autocast_forwards(tmp_path, tiny_world):
    """model.dtype bfloat16: bf16 weights, every forward (the copies and a LoRA wrapper's too) under bf16 autocast
    where the CPU computes bf16 natively, and an SFT step with fp32 adapters gives finite losses."""
    from protege.config import Config
    from protege.models.lora import add_lora
    from protege.models.discriminator import load_discriminator
    from protege.stages.student_model import load_model
    from protege.models.precision import bf16_native

    folder = build_family("qwen2_5_vl", tmp_path / "base")
    cfg = Config.model_validate({"model": {"dtype": "bfloat16"}})
    model, processor = load_model(cfg, folder)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    seen = []
    model.lm_head.register_forward_hook(lambda m, i, o: seen.append((torch.is_autocast_enabled("cpu"), o.dtype)))
    train = [r for r in load_rows(tiny_world / "train.parquet") if not isinstance(r.image, list)][:8]
    batch = processor.encode_prompts([r.question for r in train[:2]], [r.image for r in train[:2]])
    with torch.no_grad():
        copy.deepcopy(model)(**batch)
    assert seen == [(bf16_native("cpu"), torch.bfloat16)]
    policy = add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="auto")
    logs = []
    train_sft(policy, processor, train, SFTConfig(steps=2, batch_size=4, lr=1e-2, warmup_steps=0, log_every=1), seed=0,
              on_log=lambda s, m: logs.append(m["loss"]))
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(x)) for x in logs)
    assert len(seen) > 1 and all(s == (bf16_native("cpu"), torch.bfloat16) for s in seen[1:])
    disc = load_discriminator(folder, from_student=True, dtype="bfloat16")
    assert disc.head.weight.dtype == torch.float32  # the head stays fp32 on a bf16 backbone
    with torch.no_grad():
        assert disc(**processor.encode_pairs([train[0].question], [train[0].image], ["1"])).dtype == torch.float32
