"""What a vLLM engine is given for prompts with images: one placeholder per image, unexpanded, for vLLM to
expand with the model's own prompt update (handing it ids the processor already expanded would expand every
image twice). For every family of the model matrix, the ids sent to the engine, expanded by the family's own
processor with the images, equal the ids the trainer scores; an engine prompt that differs is an error naming
the row; the engine's non-finite log-probs are kept out of the importance weights and counted."""
import types

import pytest
import torch
from PIL import Image

from protege.generation.vllm_backend import EnginePromptMismatch, completions_from_outputs, prompt_mismatch, unpadded
from protege.models.processor import StudentProcessor
from tests.families import FAMILIES, build_family, family_spec

QUESTIONS = ["How many shapes are there?", "What colour is the square?", "Which bar is tallest?"]


def pictures():
    # palette, RGBA and RGB pictures of two sizes: one, two and no images per prompt
    return [Image.new("P", (64, 64), 3), [Image.new("RGBA", (64, 64), (9, 90, 200, 255)),
                                          Image.new("RGB", (64, 48), (200, 10, 10))], None]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = build_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, StudentProcessor.from_pretrained(folder)


def test_engine_ids_expanded_by_the_family_processor_are_the_trainer_ids(family):
    name, processor = family
    spec = family_spec(name)
    images = pictures()
    per_prompt = processor.image_lists(images)
    engine = processor.engine_prompt_ids(QUESTIONS, images)
    trainer = unpadded(processor.encode_prompts(QUESTIONS, images))
    placeholder = processor.tokenizer.convert_tokens_to_ids(spec.placeholder) if spec.placeholder in \
        processor.tokenizer.get_vocab() else None
    for row, (ids, expected, ims) in enumerate(zip(engine, trainer, per_prompt)):
        # the family's own expansion of the engine's ids (vLLM applies that model's prompt update likewise)
        text = processor.tokenizer.decode(ids, skip_special_tokens=False)
        kw = {"images": [[im.convert("RGB") for im in ims]]} if ims else {}
        expanded = processor.processor(text=[text], add_special_tokens=False, return_tensors="pt", **kw)
        assert expanded["input_ids"][0].tolist() == expected, (name, row)
        assert prompt_mismatch(row, expanded["input_ids"][0].tolist(), expected, processor.image_token_id) is None
        if ims:
            assert len(ids) < len(expected)  # nothing expanded yet
            if placeholder is not None:
                assert ids.count(placeholder) == len(ims), (name, row)  # one placeholder per image
        else:
            assert ids == expected  # text only: nothing to expand


def test_a_prompt_expanded_twice_is_an_error_naming_the_row(tiny_processor):
    image = Image.new("RGB", (64, 64), (120, 60, 200))
    trainer = unpadded(tiny_processor.encode_prompts(QUESTIONS[:2], [image, image]))
    pad = tiny_processor.image_token_id
    n = trainer[1].count(pad)
    at = trainer[1].index(pad)
    twice = trainer[1][:at] + [pad] * (2 * n - 1) + trainer[1][at + n:]  # what re-expanding N pads gives
    message = prompt_mismatch(1, twice, trainer[1], pad)
    assert message.startswith("prompt row 1:") and f"({2 * n - 1} image tokens)" in message
    assert f"({n} image tokens)" in message
    outs = [engine_output(trainer[0], [[5, 6]]), engine_output(twice, [[5, 6]])]
    batch = tiny_processor.encode_prompts(QUESTIONS[:2], [image, image])
    with pytest.raises(EnginePromptMismatch, match="prompt row 1"):
        completions_from_outputs(outs, batch, tiny_processor, 1, False, pad)


def engine_output(prompt_ids, samples, logprobs=None):
    """A vLLM RequestOutput's fields as the backend reads them."""
    outs = []
    for k, ids in enumerate(samples):
        lp = None if logprobs is None else [{t: types.SimpleNamespace(logprob=v)} for t, v in zip(ids, logprobs[k])]
        outs.append(types.SimpleNamespace(token_ids=ids, logprobs=lp))
    return types.SimpleNamespace(prompt_token_ids=prompt_ids, outputs=outs)


def test_non_finite_engine_logprobs_are_zeroed_marked_and_counted(tiny_processor):
    batch = tiny_processor.encode_prompts(QUESTIONS[:1], [None])
    eos = tiny_processor.stop_token_ids[0]
    samples = [[7, 8, eos], [9, 10, 11]]
    logprobs = [[-0.5, float("nan"), -0.1], [float("-inf"), -1.0, -2.0]]
    c, nonfinite = completions_from_outputs([engine_output(unpadded(batch)[0], samples, logprobs)], batch,
                                            tiny_processor, 2, True, None)
    assert nonfinite == 2
    assert torch.isfinite(c.logprobs).all()
    assert c.logprobs_finite.tolist() == [[True, False, True], [False, True, True]]
    assert c.logprobs[0].tolist() == pytest.approx([-0.5, 0.0, -0.1])
    assert c.completion_mask.tolist() == [[1, 1, 1], [1, 1, 1]]
