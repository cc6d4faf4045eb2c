"""The memory plan: parameter counts from a config on the meta device, per-rank parts that follow the settings
(LoRA, ZeRO partitions, dtype, the discriminator's default), a refusal that names the setting to change."""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from protege.cli import app
from protege.config import Config, load_config
from protege.errors import UserFacingError
from protege.plan import GiB, check_stage_fits, model_shape, parse_memory, plan_stages
from tests.conftest import REPO

SEVEN_B = REPO / "docs" / "examples" / "qwen2.5-vl-7b"


def by_stage(plans):
    return {p.stage: p for p in plans}


@pytest.fixture(scope="module")
def seven_b():
    return model_shape(Config(), REPO, SEVEN_B)


def test_counts_the_parameters_the_model_has(tmp_path):
    from tests.families import build_family
    from protege.models.student import load_student

    folder = build_family("qwen2_5_vl", tmp_path / "m")
    model, _ = load_student(folder)
    shape = model_shape(Config(), tmp_path, folder)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.groups["all"] == shape.params and 0 < shape.groups["lora"] < shape.params
    assert shape.vocab == model.config.get_text_config().vocab_size


def test_seven_b_full_fp32_does_not_fit_and_lora_bf16_does(seven_b):
    assert 8.2e9 < seven_b.params < 8.4e9  # Qwen2.5-VL-7B: 8.29B
    full = by_stage(plan_stages(Config(), seven_b, device_bytes=80 * GiB))
    sft = full["sft"]
    assert sft.parts["optimizer"] == seven_b.params * 8  # AdamW's two fp32 moments
    assert sft.peak > 80 * GiB
    assert "sft.trainable: lora" in sft.refusal(80 * GiB)
    recipe = load_config(SEVEN_B / "params.yaml")
    lora = by_stage(plan_stages(recipe, model_shape(recipe, REPO, SEVEN_B), device_bytes=80 * GiB))
    assert all(p.peak < 80 * GiB for p in lora.values())
    assert lora["sft"].parts["weights"] == seven_b.params * 2  # bf16


def test_zero3_partitions_weights_and_optimizer_over_ranks(seven_b):
    cfg = Config.model_validate({"sft": {"backend": "deepspeed", "zero_stage": 3}})
    one = by_stage(plan_stages(cfg, seven_b, processes=1))["sft"]
    four = by_stage(plan_stages(cfg, seven_b, processes=4))["sft"]
    assert four.parts["weights"] == one.parts["weights"] // 4
    assert four.parts["optimizer"] == one.parts["optimizer"] // 4


def test_your_own_model_gets_a_lora_discriminator_unless_all_is_asked_for(seven_b):
    own = Config.model_validate({"model": {"path": "/ckpt/qwen"}, "rl": {"algorithm": "ril", "offload_idle": False}})
    asked = Config.model_validate({"model": {"path": "/ckpt/qwen"},
                                   "rl": {"algorithm": "ril", "offload_idle": False, "disc_trainable": "all"}})
    lora = by_stage(plan_stages(own, seven_b, device_bytes=80 * GiB))["rl"]
    full = by_stage(plan_stages(asked, seven_b, device_bytes=80 * GiB))["rl"]
    assert lora.parts["discriminator"] * 3 < full.parts["discriminator"]
    assert "rl.disc_trainable: lora" in full.refusal(80 * GiB)


def test_memory_sizes_parse_and_bad_ones_name_the_option():
    assert parse_memory("80GB") == 80 * GiB == parse_memory("80 GiB") == parse_memory("81920MiB")
    with pytest.raises(UserFacingError, match="--gpu-memory 'eighty'"):
        parse_memory("eighty")


def test_no_config_to_plan_from_is_one_line(tmp_path):
    with pytest.raises(UserFacingError, match="no config.json to plan from"):
        model_shape(Config(), tmp_path)


def test_a_stage_on_the_cpu_is_not_checked(tmp_path):
    assert check_stage_fits(Config(), "rl", tmp_path) is None  # no GPU here: nothing to refuse


def test_cli_prints_the_table_and_the_refusals():
    res = CliRunner().invoke(app, ["plan", "--model", str(SEVEN_B), "--gpu-memory", "80GB",
                                   "--params", str(REPO / "params.yaml")])
    assert res.exit_code == 0, res.output
    assert "| per rank (GiB) | sft | disc_pretrain | rl | agent_rl | tool_rl |" in res.output
    assert "8.29B parameters" in res.output and "fits 80 GiB x 1" in res.output
    assert "sft: needs about" in res.output
    bad = CliRunner().invoke(app, ["plan", "--model", str(Path("/nonexistent"))])
    assert bad.exit_code == 1 and "no config.json to plan from" in bad.output
