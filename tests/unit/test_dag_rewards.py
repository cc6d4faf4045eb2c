"""Your own reward modules are dependencies of the RL stages in dvc.yaml: editing one re-runs RL."""
import yaml

from protege import dag
from protege.config import load_config
from tests.conftest import REPO


def _cfg(rewards):
    cfg = load_config(REPO / "params.yaml")
    return cfg.model_copy(update={"rl": cfg.rl.model_validate({**cfg.rl.model_dump(), "rewards": rewards})})


def test_reward_modules_in_the_project_are_rl_dependencies(tmp_path):
    (tmp_path / "mypkg" / "scoring").mkdir(parents=True)
    (tmp_path / "mypkg" / "rewards.py").write_text("def f(**kw): return []\n")
    (tmp_path / "mypkg" / "scoring" / "__init__.py").write_text("def g(**kw): return []\n")
    cfg = _cfg([{"function": "judge", "weight": 1.0}, {"function": "mypkg.rewards:f", "weight": 0.5},
                {"function": "mypkg.scoring:g", "weight": 0.5}, {"function": "installed.elsewhere:h", "weight": 1.0}])
    stages = yaml.safe_load(dag.render(cfg, tmp_path))["stages"]
    for name in ("rl", "rl_baseline"):
        deps = stages[name]["deps"]
        assert "mypkg/rewards.py" in deps and "mypkg/scoring/__init__.py" in deps, name
        assert not any("installed" in d for d in deps)
    assert "mypkg/rewards.py" not in stages["sft"]["deps"]
    # without a project (the committed dvc.yaml's rendering), nothing is looked up
    assert "mypkg/rewards.py" not in yaml.safe_load(dag.render(cfg))["stages"]["rl"]["deps"]


def test_no_rewards_render_as_before(tmp_path):
    cfg = load_config(REPO / "params.yaml")
    assert dag.render(cfg, tmp_path) == dag.render(cfg)
