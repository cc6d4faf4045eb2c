"""The tiny student: real Qwen2-VL architecture, save/load round trip, batched generation, SFT learns."""
import torch

from protege.config import SFTConfig
from protege.data.rows import load_rows
from protege.generation.transformers_backend import Sampling, completion_mask, generate_answers
from protege.models.student import load_student, save_student
from protege.train.sft import answer_loss, train_sft


def test_save_load_round_trip(tiny_student, tiny_processor, tiny_world, tmp_path):
    save_student(tiny_student, tiny_processor, tmp_path / "s")
    assert (tmp_path / "s" / "model.safetensors").exists()
    assert not list((tmp_path / "s").glob("*.bin"))
    model, proc = load_student(tmp_path / "s")
    rows = load_rows(tiny_world / "train.parquet")[:3]
    batch = proc.encode_pairs([r.question for r in rows], [r.image for r in rows], [r.answer for r in rows])
    inputs = {k: v for k, v in batch.items() if k != "answer_mask"}
    tiny_student.eval()
    assert torch.allclose(model(**inputs).logits, tiny_student(**inputs).logits)


def test_prompt_is_prefix_and_mask_covers_answer(tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "train.parquet")
    r = next(r for r in rows if not isinstance(r.image, list))
    batch = tiny_processor.encode_pairs([r.question], [r.image], [r.answer])
    answer_ids = batch["input_ids"][0][batch["answer_mask"][0] == 1]
    text = tiny_processor.tokenizer.decode(answer_ids)
    assert text == r.answer + tiny_processor.tokenizer.eos_token
    assert int(batch["mm_token_type_ids"].sum()) == 16  # 64x64 image, patch 8, merge 2
    two = next(r for r in rows if isinstance(r.image, list))  # BLINK-style: two images, 16 tokens each
    assert int(tiny_processor.encode_pairs([two.question], [two.image], [two.answer])["mm_token_type_ids"].sum()) == 32


def test_completion_mask_stops_after_eos():
    ids = torch.tensor([[5, 9, 2, 7], [5, 6, 7, 8]])
    assert completion_mask(ids, eos_id=2).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_batched_generation_equals_one_at_a_time(tiny_student, tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "test.parquet")[:6]
    q, im = [r.question for r in rows], [r.image for r in rows]
    greedy = Sampling(do_sample=False, max_new_tokens=4)
    batched, _, _ = generate_answers(tiny_student, tiny_processor, q, im, greedy, batch_size=6)
    single, _, _ = generate_answers(tiny_student, tiny_processor, q, im, greedy, batch_size=1)
    assert batched == single


def test_sft_changes_parameters_and_lowers_loss(tiny_student, tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "train.parquet")
    batch = tiny_processor.encode_pairs([r.question for r in rows[:16]], [r.image for r in rows[:16]],
                                        [r.answer for r in rows[:16]])
    before = {k: v.clone() for k, v in tiny_student.state_dict().items()}
    with torch.no_grad():
        loss0 = answer_loss(tiny_student, batch).item()
    logged = []
    train_sft(tiny_student, tiny_processor, rows, SFTConfig(steps=15, batch_size=16, lr=2e-3, warmup_steps=0, log_every=5), seed=0,
              on_log=lambda s, m: logged.append(m["loss"]))
    with torch.no_grad():
        loss1 = answer_loss(tiny_student, batch).item()
    assert loss1 < loss0
    assert len(logged) == 3
    changed = [k for k, v in tiny_student.state_dict().items() if not torch.equal(v, before[k])]
    assert any("visual" in k for k in changed) and any("lm_head" in k for k in changed)


def test_answer_logprobs_batched_and_bounded(tiny_student, tiny_processor, tiny_world):
    from protege.data.curate import answer_logprobs

    rows = load_rows(tiny_world / "rl.parquet")[:6]
    batched = answer_logprobs(tiny_student, tiny_processor, rows, batch_size=6)
    single = answer_logprobs(tiny_student, tiny_processor, rows, batch_size=1)
    assert len(batched) == 6 and all(lp < 0 for lp in batched)
    assert torch.allclose(torch.tensor(batched), torch.tensor(single), atol=1e-5)


def test_generation_never_emits_vision_tokens(tiny_student, tiny_processor, tiny_world):
    from protege.generation.transformers_backend import sample

    # make the image placeholder the most likely next token everywhere
    with torch.no_grad():
        tiny_student.lm_head.weight[tiny_processor.image_token_id] += 50.0
    rows = load_rows(tiny_world / "test.parquet")[:4]
    batch = tiny_processor.encode_prompts([r.question for r in rows], [r.image for r in rows])
    c = sample(tiny_student, tiny_processor, batch, Sampling(do_sample=True, max_new_tokens=6))
    generated = c.sequences[:, c.prompt_len:]
    assert not any(int(t) in tiny_processor.vision_token_ids for t in generated.flatten())


def test_prompts_with_several_images_or_none(tiny_student, tiny_processor, tiny_world):
    """BLINK/MMMU questions carry several images, some MMMU questions none; one batch mixes them."""
    from protege.generation.transformers_backend import sample

    rows = load_rows(tiny_world / "test.parquet")[:3]
    images = [[rows[0].image, rows[1].image], rows[2].image, None]
    batch = tiny_processor.encode_prompts(["Which image has more shapes?", "What colour?", "What is 2+2?"], images)
    per_image = int(batch["image_grid_thw"][0].prod()) // 4
    n_pad = (batch["input_ids"] == tiny_processor.image_token_id).sum(dim=1).tolist()
    assert batch["image_grid_thw"].shape[0] == 3 and n_pad == [2 * per_image, per_image, 0]
    c = sample(tiny_student, tiny_processor, batch, Sampling(max_new_tokens=4))
    assert len(c.texts) == 3

    text_only = tiny_processor.encode_prompts(["What is 2+2?"], [None])
    assert "pixel_values" not in text_only
    assert len(sample(tiny_student, tiny_processor, text_only, Sampling(max_new_tokens=4)).texts) == 1


def test_a_repeated_image_is_processed_once_with_the_same_result(tiny_processor, tiny_world):
    rows = load_rows(tiny_world / "train.parquet")
    one = next(r for r in rows if not isinstance(r.image, list))
    two = next(r for r in rows if isinstance(r.image, list))
    copies = [one.image.copy() for _ in range(3)]  # distinct objects: processed one by one
    shared = [one.image] * 3                       # one object: processed once
    qs, answers = [one.question] * 3 + [two.question], ["a", "b", "c", "d"]
    a = tiny_processor.encode_pairs(qs, copies + [two.image], answers)
    b = tiny_processor.encode_pairs(qs, shared + [two.image], answers)
    for key in ("pixel_values", "image_grid_thw", "input_ids", "mm_token_type_ids"):
        assert torch.equal(a[key], b[key]), key


def test_selected_rows_keep_each_prompts_images_together(tiny_processor, tiny_world):
    """G samples of a prompt repeat its images with it, in order: the same inputs as encoding the repeated
    prompts, for prompts with two images, one, and none."""
    rows = load_rows(tiny_world / "test.parquet")[:3]
    images = [[rows[0].image, rows[1].image], rows[2].image, None]
    questions = ["Which image has more shapes?", "What colour?", "What is 2+2?"]
    batch = tiny_processor.encode_prompts(questions, images)
    order = [0, 0, 1, 2, 1, 2, 0]
    picked = tiny_processor.select_rows(batch, images, order)
    again = tiny_processor.encode_prompts([questions[i] for i in order], [images[i] for i in order])
    assert set(picked) == set(again)
    for key in again:
        assert torch.equal(picked[key], again[key]), key
    assert picked["image_grid_thw"].shape[0] == 2 * 3 + 2  # rows 0 (x3, two images) and 1 (x2, one image)
