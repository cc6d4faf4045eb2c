import subprocess
import sys

import pytest

from protege.config import Config, ConfigError, load_config
from tests.conftest import REPO


def write(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


def test_repo_params_are_valid():
    cfg = load_config(REPO / "params.yaml")
    assert cfg.rl.algorithm == "ril" and cfg.rl.baseline == "dr_grpo"
    assert cfg.rl.clip_eps == 0.2 and cfg.rl.kl_beta == 0.04


def test_defaults_fill_missing_sections(tmp_path):
    cfg = load_config(write(tmp_path, "seed: 3\n"))
    assert cfg.seed == 3 and cfg == Config(seed=3)


def test_a_sub_section_given_in_part_keeps_its_declared_defaults(tmp_path):
    """tool.rl is an AgentRLConfig whose defaults ToolConfig declares (gtpo, 64 new tokens): a params file giving
    a few of its keys gets those for the rest, as Config() and docs/configuration.md show, not the class's."""
    cfg = load_config(write(tmp_path, "tool:\n  rl: {steps: 3, gtpo: {gamma: 0.5}}\n"))
    assert (cfg.tool.rl.algorithm, cfg.tool.rl.max_new_tokens) == (Config().tool.rl.algorithm, 64) == ("gtpo", 64)
    assert (cfg.tool.rl.steps, cfg.tool.rl.gtpo.gamma) == (3, 0.5)
    assert load_config(write(tmp_path, "tool:\n  rl: {algorithm: grpo}\n")).tool.rl.algorithm == "grpo"


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "rl:\n  learning_rate: 0.1\n"))
    msg = str(err.value)
    assert "unknown key 'rl.learning_rate'" in msg and "lr" in msg
    assert "\n" not in msg


def test_unknown_top_level_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'sftt'"):
        load_config(write(tmp_path, "sftt: {}\n"))


def test_wrong_type_names_key_and_type(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "sft:\n  steps: many\n"))
    assert "key 'sft.steps' expects int" in str(err.value)
    assert "'many'" in str(err.value)


def test_inconsistent_model_sizes(tmp_path):
    with pytest.raises(ConfigError, match="divisible"):
        load_config(write(tmp_path, "model:\n  hidden_size: 63\n"))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such params file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "rl: [\n"))


def test_cli_prints_one_line_and_fails(tmp_path):
    p = write(tmp_path, "rl:\n  bogus: 1\n")
    proc = subprocess.run([sys.executable, "-m", "protege", "config", "show", "--params", str(p)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "unknown key 'rl.bogus'" in lines[0]


def test_cli_config_show_prints_resolved(tmp_path):
    p = write(tmp_path, "sft:\n  steps: 7\n")
    proc = subprocess.run([sys.executable, "-m", "protege", "config", "show", "--params", str(p)],
                          capture_output=True, text=True, check=True)
    assert '"steps": 7' in proc.stdout and '"clip_eps": 0.2' in proc.stdout


def test_pipeline_refuses_params_that_leave_dag_keys_to_defaults(tmp_path):
    import shutil

    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    write(tmp_path, "seed: 1\nworld: {n_train: 10}\n")
    proc = subprocess.run([sys.executable, "-m", "protege", "pipeline", "--project", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "dvc.yaml tracks" in proc.stderr and "model" in proc.stderr and "rl" in proc.stderr


def test_rl_teacher_must_be_in_pool(tmp_path):
    assert load_config(write(tmp_path, "rl: {algorithm: ril, teachers: verbose}\n")).rl.teachers == "verbose"
    with pytest.raises(ConfigError, match="rl.teachers is 'gpt'"):
        load_config(write(tmp_path, "rl: {teachers: gpt}\n"))


def test_teacher_backend_needs_its_fields(tmp_path):
    with pytest.raises(ConfigError, match="backend 'openai' needs 'base_url'"):
        load_config(write(tmp_path, "teachers:\n  pool:\n    - {name: api, backend: openai, model: m}\n"))
    with pytest.raises(ConfigError, match="unique names"):
        load_config(write(tmp_path, "teachers:\n  pool: [{name: concise}, {name: concise}]\n"))


def test_yaml_merge_keys_still_work(tmp_path):
    from protege.config import load_config

    p = tmp_path / "params.yaml"
    p.write_text("sft:\n  <<: {lr: 0.01, steps: 5}\n  steps: 7\n")
    cfg = load_config(p)
    assert (cfg.sft.lr, cfg.sft.steps) == (0.01, 7)


# --- which settings change results: declared once on the field, read by fingerprints, DVC and MLflow ---------

def test_result_params_and_tracked_params_follow_the_field_marks():
    from protege.config import AgentConfig, RLConfig, result_params, tracked_params

    rl = RLConfig()
    assert {"lr", "device", "eval_every", "eval_items", "advantage"} <= set(result_params(rl))
    assert not {"steps", "save_every", "offload_idle", "vllm_memory", "baseline"} & set(result_params(rl))
    assert {"steps", "save_every", "baseline"} <= set(tracked_params(rl))
    assert not {"offload_idle", "vllm_memory"} & set(tracked_params(rl))
    agent = result_params(AgentConfig())  # sub-sections are filtered too
    assert "eval_episodes" not in agent and "steps" not in agent["rl"] and "gamma" in agent["rl"]["gtpo"]


def test_untracked_keys_are_what_dvc_leaves_out():
    from protege.config import untracked_keys
    from protege.stage_deps import params_read

    keys = untracked_keys(Config)
    assert {"threads", "orchestration.jobs", "sft.log_every", "rl.offload_idle", "agent.rl.vllm_memory"} <= keys
    assert "rl.steps" not in keys and "sft.save_every" not in keys
    assert not any(k in keys for s in ("sft", "rl", "agent_rl", "tool_rl") for k in params_read(s))


@pytest.mark.parametrize("loop", ["sft", "disc_pretrain", "agent_sft", "rl", "agent_rl"])
def test_every_resume_fingerprint_ignores_cadence_and_placement_and_sees_the_lr(loop):
    from protege.config import AgentConfig, DiscPretrainConfig, RLConfig, SFTConfig, result_params
    from protege.rl.agent_loop import agent_fingerprint
    from protege.rl.loop import fingerprint as rl_fingerprint
    from protege.train.agent_sft import sft_fingerprint
    from protege.runtime.state import fingerprint

    def fp(**changes):
        if loop == "sft":
            return fingerprint(result_params(SFTConfig(**changes)), 0)
        if loop == "disc_pretrain":
            return fingerprint(result_params(DiscPretrainConfig(**changes)), 0)
        if loop == "agent_sft":
            return sft_fingerprint(AgentConfig(sft=changes), 64, 0)
        if loop == "rl":
            return rl_fingerprint(RLConfig(**changes), 0)
        return agent_fingerprint(AgentConfig(rl={"schedule": "constant", **changes}), 0)  # steps count under cosine

    same = {"save_every": 7}
    if loop in ("sft", "agent_sft"):
        same["log_every"] = 3
    if loop == "rl":
        same.update(offload_idle=False, vllm_memory=0.5, steps=99, baseline="grpo")
    if loop == "agent_rl":
        same.update(steps=99, vllm_memory=0.5)
    assert fp(**same) == fp()
    assert fp(lr=0.123) != fp()


def test_a_new_setting_at_its_neutral_value_keeps_old_resume_states():
    """A setting added after runs saved resume states (ppo.value_warmup_steps) is left out of the states'
    identity at its neutral value, so those states still resume; any other value is a different run."""
    from protege.config import AgentRLConfig, result_params
    from protege.rl.agent_loop import agent_fingerprint
    from protege.config import AgentConfig

    assert "value_warmup_steps" not in result_params(AgentRLConfig())["ppo"]
    assert result_params(AgentRLConfig(ppo={"value_warmup_steps": 3}))["ppo"]["value_warmup_steps"] == 3
    assert agent_fingerprint(AgentConfig(), 0) != agent_fingerprint(AgentConfig(rl={"ppo": {"value_warmup_steps": 3}}), 0)
