"""params.yaml is the defaults: loading it gives exactly `Config()`, and it names every setting of the schema, so
config.py, params.yaml and docs/configuration.md (rendered from config.py) say the same thing."""
import copy

from pydantic import BaseModel

from protege.config import Config, read_params
from tests.conftest import REPO


def schema_leaves(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Dotted names of every setting (a field that is not itself a section), walking sub-sections."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += schema_leaves(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def _at(tree, key: str):
    for part in key.split("."):
        tree = tree[part]
    return tree


def differing_keys(raw: dict) -> list[str]:
    """Settings whose value in the params mapping `raw` (once validated) differs from `Config()`'s default."""
    given, default = Config.model_validate(raw).model_dump(), Config().model_dump()
    return [k for k in schema_leaves() if _at(given, k) != _at(default, k)]


def missing_keys(raw: dict) -> list[str]:
    """Settings the params mapping `raw` leaves out (to their defaults)."""
    out = []
    for key in schema_leaves():
        node = raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                out.append(key)
                break
            node = node[part]
    return out


def repo_params() -> dict:
    return read_params(REPO / "params.yaml")[0]


def test_params_yaml_is_the_defaults():
    raw = repo_params()
    differ = differing_keys(raw)
    assert not differ, ("params.yaml and protege/config.py's defaults differ at "
                        + ", ".join(f"{k} (params.yaml {_at(Config.model_validate(raw).model_dump(), k)!r}, "
                                    f"config.py {_at(Config().model_dump(), k)!r})" for k in differ)
                        + ": give the field in config.py the value params.yaml runs")
    assert Config.model_validate(raw) == Config()


def test_params_yaml_names_every_setting():
    missing = missing_keys(repo_params())
    assert not missing, ("params.yaml leaves out " + ", ".join(missing)
                         + ": add each with its config.py default and a comment (null defaults as `key: null`)")


def test_the_checks_name_the_key_that_breaks_them():
    raw = repo_params()
    changed = copy.deepcopy(raw)
    changed["agent"]["rl"]["gtr"]["guidance"] = "sft"
    changed["rl"]["max_new_tokens"] = 9
    changed["merge"]["parameters"] = {"density": 0.5}
    assert differing_keys(changed) == ["rl.max_new_tokens", "merge.parameters", "agent.rl.gtr.guidance"]
    fewer = copy.deepcopy(raw)
    del fewer["tool"]["rl"]["ppo"]["objective"]
    del fewer["evaluate"]["judge"]
    del fewer["tool"]["sandbox"]
    assert missing_keys(fewer) == ["tool.sandbox." + k for k in Config.model_fields["tool"].annotation.model_fields[
        "sandbox"].annotation.model_fields] + ["tool.rl.ppo.objective", "evaluate.judge"]
    assert differing_keys(fewer) == []  # a key left out takes its default: only the key check sees it


def test_a_partial_sub_section_keeps_the_defaults_its_parent_declares():
    """agent.rl and tool.rl share one class, agent.sft and tool.sft another, with different defaults; a params
    file that gives a few keys of one still gets the documented defaults (Config()'s) for the others, deeply."""
    cfg = Config.model_validate({"agent": {"rl": {"lr": 1e-3, "gtr": {"merge": "ema"}}},
                                 "tool": {"rl": {"steps": 3}, "sft": {"lr": 1e-3}}})
    assert (cfg.agent.rl.algorithm, cfg.agent.rl.schedule, cfg.agent.rl.gtr.guidance) == ("ppo", "cosine", "kl")
    assert (cfg.agent.rl.lr, cfg.agent.rl.gtr.merge) == (1e-3, "ema")
    assert (cfg.tool.rl.schedule, cfg.tool.rl.gtr.guidance) == ("constant", "none")
    assert cfg.tool.sft.steps == Config().tool.sft.steps == 800 and cfg.agent.sft.steps == 1200
    assert Config.model_validate({"agent": {"rl": {"algorithm": "grpo"}}}).agent.rl.algorithm == "grpo"
