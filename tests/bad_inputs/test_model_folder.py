"""A folder handed as model.path (or to `protege model check`) that cannot be a student fails before any
compute, writes nothing, and says in one line which folder or key is wrong and what was expected."""
import json
import shutil

import pytest
from typer.testing import CliRunner

from protege.cli import app
from protege.models.hf_folder import CheckpointError, check_folder, folder_digest
from tests.families import build_family


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return build_family("qwen2_vl", tmp_path_factory.mktemp("good") / "qwen2_vl")


def broken(good, tmp_path, case):
    folder = tmp_path / case
    shutil.copytree(good, folder)
    if case == "no_config":
        (folder / "config.json").unlink()
    elif case == "pickled_weights_only":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif case == "no_tokenizer":
        (folder / "tokenizer.json").unlink()
        (folder / "tokenizer_config.json").unlink()
    elif case == "no_image_processor":
        (folder / "preprocessor_config.json").unlink()
        (folder / "processor_config.json").unlink()
    elif case == "no_chat_template":
        (folder / "chat_template.jinja").unlink()
        for name in ("tokenizer_config.json", "processor_config.json"):
            data = json.loads((folder / name).read_text())
            data.pop("chat_template", None)
            (folder / name).write_text(json.dumps(data))
    elif case == "text_only_architecture":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config["text_config"], "model_type": "qwen2",
                                                        "architectures": ["Qwen2ForCausalLM"]}))
    elif case == "remote_code":
        config = json.loads((folder / "config.json").read_text())
        config["auto_map"] = {"AutoModelForImageTextToText": "modeling_custom.CustomVLM"}
        (folder / "config.json").write_text(json.dumps(config))
    elif case == "unknown_model_type":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "no_such_family"}))
    elif case == "config_not_json":
        (folder / "config.json").write_text("{not json")
    return folder


CASES = {
    "no_config": "not a Hugging Face checkpoint (config.json missing)",
    "pickled_weights_only": "no *.safetensors weights (only pytorch_model.bin, which protege never unpickles",
    "no_tokenizer": "no tokenizer files",
    "no_image_processor": "no image processor config",
    "no_chat_template": "no chat template",
    "text_only_architecture": "model_type 'qwen2' (Qwen2ForCausalLM) has no image-text-to-text class",
    "remote_code": "set model.trust_remote_code: true",
    "unknown_model_type": "model_type 'no_such_family' is unknown to this transformers",
    "config_not_json": "config.json: not valid JSON",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_folder_that_cannot_be_a_student_is_named(good, tmp_path, case):
    folder = broken(good, tmp_path, case)
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(CheckpointError) as err:
        check_folder(folder)
    message = str(err.value)
    assert message.startswith(str(folder)) and CASES[case] in message and "\n" not in message, message
    res = CliRunner().invoke(app, ["model", "check", str(folder)])
    assert res.exit_code == 1 and CASES[case] in res.output and "Traceback" not in res.output, res.output
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written


def test_not_a_folder(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder; expected a Hugging Face checkpoint folder"):
        check_folder(tmp_path / "missing")


def test_model_check_prints_what_protege_reads(good):
    res = CliRunner().invoke(app, ["model", "check", str(good)])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["processor"] == "Qwen2VLProcessor" and info["end_of_turn"] == "<|im_end|>"
    assert info["prompt"].endswith("<|im_start|>assistant\n") and "<|image_pad|>" in info["prompt"]


def test_the_digest_follows_content_not_stats(good, tmp_path):
    a = shutil.copytree(good, tmp_path / "a")
    cache = tmp_path / "digests.json"
    first = folder_digest(a, cache)
    assert folder_digest(shutil.copytree(good, tmp_path / "b"), cache) == first  # a copy: new stats, same digest
    assert json.loads(cache.read_text())  # md5s kept for the next call
    data = (a / "chat_template.jinja").read_bytes()
    (a / "chat_template.jinja").write_bytes(data.replace(b"assistant", b"ASSISTANT"))
    assert folder_digest(a, cache) != first


def test_an_image_size_the_processor_cannot_take_is_named_before_compute(good):
    from types import SimpleNamespace

    from PIL import Image

    from protege.errors import UserFacingError
    from protege.models.processor import StudentProcessor

    processor = StudentProcessor.from_pretrained(good)
    rows = [SimpleNamespace(id="a", image=Image.new("RGB", (64, 64))),
            SimpleNamespace(id="b", image=[Image.new("RGB", (64, 64)), Image.new("RGB", (1, 400))])]
    with pytest.raises(UserFacingError, match=r"data/world/train.parquet: row id='b': image 1x400 cannot go through "
                                              r"the model's image processor \(Qwen2VLImageProcessorPil\): absolute "
                                              r"aspect ratio must be smaller than 200"):
        processor.check_images(rows, "data/world/train.parquet")
    processor.check_images(rows[:1], "data/world/train.parquet")  # a size it takes passes
