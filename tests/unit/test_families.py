"""The tiny checkpoints of tests/families.py are real Hugging Face folders of their families: protege's
generic loader reads them, their processors expand the family's image placeholders, and the models run.

SmolVLM's processor needs the `num2words` package (a dependency of protege); where it is missing those tests
skip. Without torchvision, `load_processor` builds SmolVLMProcessor with no video processor, and
SmolVLMProcessor.apply_chat_template reads `video_processor.num_frames`: protege's StudentProcessor.render
then renders the same template through the generic ProcessorMixin path.
"""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.families import FAMILIES, build_family, family_spec, n_params

QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many shapes?"}]}]
LONGER = [{"role": "user", "content": [
    {"type": "image"}, {"type": "text", "text": "What is the color of the largest shape in the image?"}]}]
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "preprocessor_config.json", "processor_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_family(name, root / name) for name in FAMILIES}


@pytest.fixture(scope="module")
def image():
    from protege.world.questions import make_item

    return make_item(random.Random(1), 64).images[0]


def _needs(name: str) -> None:
    if name == "smolvlm" and importlib.util.find_spec("num2words") is None:
        pytest.skip("SmolVLMProcessor needs the num2words package, which is not installed")


def _processor(folder: Path):
    from protege.models.hf_folder import load_processor

    return load_processor(folder)


def _render(processor, messages) -> str:
    try:
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except AttributeError as exc:  # image-only SmolVLMProcessor (module doc); the same template, via the tokenizer
        if getattr(processor, "video_processor", True) is not None or "num_frames" not in str(exc):
            raise
        return processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _model(folder: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(folder).eval()


def _config_image_token_id(config) -> int:
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return value
    raise AssertionError(f"{type(config).__name__} names no image token")


@pytest.mark.parametrize("name", FAMILIES)
def test_folder_is_a_checkpoint(folders, name):
    from protege.models.hf_folder import check_folder

    folder = folders[name]
    assert {f for f in FILES if (folder / f).is_file()} == set(FILES)
    config = check_folder(folder)
    assert config["model_type"] == name
    assert (folder / "chat_template.jinja").read_text() == family_spec(name).chat_template


@pytest.mark.parametrize("name", FAMILIES)
def test_processor_renders_the_family_prompt(folders, name):
    """protege renders through the folder's own processor (StudentProcessor.render), which also covers the
    image-only SmolVLMProcessor whose own apply_chat_template reads video_processor.num_frames."""
    from protege.models.processor import StudentProcessor

    _needs(name)
    spec = family_spec(name)
    wrapped = StudentProcessor.from_pretrained(folders[name])
    assert type(wrapped.processor).__name__ == spec.processor_class
    prompt = wrapped.render(QUESTION, add_generation_prompt=True)
    assert prompt.count(spec.placeholder) == 1
    assert prompt.endswith(spec.generation_prompt)
    # an assistant turn continues the generation prompt and ends with the family's end-of-turn token
    answer = [{"role": "assistant", "content": [{"type": "text", "text": "3"}]}]
    full = wrapped.render(QUESTION + answer, add_generation_prompt=False)
    assert full.startswith(prompt) and full.rstrip("\n").endswith("3" + spec.end_of_turn)
    assert wrapped.end_of_turn == spec.end_of_turn


@pytest.mark.parametrize("name", FAMILIES)
def test_template_renders_a_system_turn_and_several_turns(folders, name):
    from transformers import AutoTokenizer

    spec = family_spec(name)
    tokenizer = AutoTokenizer.from_pretrained(folders[name])
    conversation = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                    *QUESTION,
                    {"role": "assistant", "content": [{"type": "text", "text": "3"}]},
                    {"role": "user", "content": "And the colors?"}]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert text.count("Be brief.") == 1 and text.count(spec.placeholder) == 1
    order = [text.index(part) for part in ("Be brief.", spec.placeholder, "3" + spec.end_of_turn, "And the colors?")]
    assert order == sorted(order)
    assert text.endswith(spec.generation_prompt)


@pytest.mark.parametrize("name", FAMILIES)
def test_token_ids_agree(folders, name):
    _needs(name)
    from transformers import AutoConfig, GenerationConfig

    spec = family_spec(name)
    folder = folders[name]
    tokenizer = _processor(folder).tokenizer
    config = AutoConfig.from_pretrained(folder)
    text = config.get_text_config()
    assert text.vocab_size >= len(tokenizer)
    assert _config_image_token_id(config) == tokenizer.convert_tokens_to_ids(spec.feature_token)
    for token in spec.specials:  # each special token is one token, never split
        assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)]
    gen = GenerationConfig.from_pretrained(folder)
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    assert eos[0] == tokenizer.convert_tokens_to_ids(spec.end_of_turn)
    assert gen.pad_token_id == tokenizer.pad_token_id is not None
    assert text.initializer_range == pytest.approx(0.1)


@pytest.mark.parametrize("name", FAMILIES)
def test_model_runs_on_a_left_padded_batch(folders, image, name):
    _needs(name)
    spec = family_spec(name)
    folder = folders[name]
    processor = _processor(folder)
    prompts = [_render(processor, QUESTION), _render(processor, LONGER)]
    enc = processor(text=prompts, images=[[image], [image]], padding=True, padding_side="left", return_tensors="pt")
    assert enc["attention_mask"][0, 0] == 0 and enc["attention_mask"][:, -1].all()  # left padding
    feature_id = processor.tokenizer.convert_tokens_to_ids(spec.feature_token)
    assert (enc["input_ids"] == feature_id).sum(dim=1).tolist() == [spec.image_tokens] * 2

    model = _model(folder)
    assert n_params(model) < 1_000_000
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape[:2] == enc["input_ids"].shape
    assert logits.shape[-1] == model.config.get_text_config().vocab_size
    assert torch.isfinite(logits).all()
    # the image reaches the text model: another image changes the logits after it
    other = image.transpose(0)  # mirrored left-right
    enc2 = processor(text=prompts, images=[[other], [other]], padding=True, padding_side="left", return_tensors="pt")
    with torch.no_grad():
        assert not torch.allclose(model(**enc2).logits[:, -1], logits[:, -1])

    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    length = enc["input_ids"].shape[1]
    assert out.shape[0] == 2 and length < out.shape[1] <= length + 4
    assert torch.equal(out[:, :length], enc["input_ids"])


@pytest.mark.parametrize("name", FAMILIES)
def test_same_seed_same_checkpoint(folders, tmp_path, name):
    again = build_family(name, tmp_path / "again", seed=0)
    other = build_family(name, tmp_path / "other", seed=1)
    first, second = load_file(folders[name] / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    for f in FILES:
        if f != "model.safetensors":
            assert (folders[name] / f).read_bytes() == (again / f).read_bytes(), f
    different = load_file(other / "model.safetensors")
    assert any(not torch.equal(first[k], different[k]) for k in first if first[k].numel() > 100)
