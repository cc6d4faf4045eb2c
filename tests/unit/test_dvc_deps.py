"""dvc.yaml declares every protege source file a stage can import and every param it reads, so `dvc status`
never calls stale outputs up to date (regenerate with `python dev/sync_dvc_deps.py`)."""
from pathlib import Path

import pytest
import yaml

from protege import stage_deps

ROOT = Path(__file__).resolve().parents[2]
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_declares_its_code_and_params(stage):
    spec = STAGES[stage]
    deps = [str(d) if not isinstance(d, dict) else next(iter(d)) for d in spec.get("deps", [])]
    missing = stage_deps.missing_code_deps(stage, deps)
    assert not missing, f"dvc.yaml stage {stage}: add to deps {missing} (or run dev/sync_dvc_deps.py)"
    params = [str(p) for p in spec.get("params", [])]
    missing = stage_deps.missing_params(stage, params)
    assert not missing, f"dvc.yaml stage {stage}: add to params {missing} (or run dev/sync_dvc_deps.py)"


def test_the_analysis_sees_lazy_imports_and_config_reads():
    files = {str(p) for p in stage_deps.code_files("rl")}
    assert {"protege/rewards/judge.py", "protege/rl/loop.py", "protege/models/processor.py",
            "protege/config.py"} <= files
    assert "protege/cli.py" not in files
    reads = stage_deps.params_read("rl")
    # rl is read whole: its settings are listed but those that change nothing the stage writes
    assert {"rl.lr", "rl.w_sim", "seed", "evaluate.batch_size"} <= reads and "threads" not in reads
    assert "rl" not in reads and "rl.offload_idle" not in reads and "rl.vllm_sleep" not in reads


def test_an_undeclared_import_or_read_is_caught(tmp_path, monkeypatch):
    package = tmp_path / "protege"
    (package / "stages").mkdir(parents=True)
    for rel in ("__init__.py", "stages/__init__.py", "tracking.py", "config.py", "helper.py", "other.py"):
        (package / rel).write_text("")
    (package / "helper.py").write_text("def f():\n    from protege import other\n")
    (package / "stages" / "demo.py").write_text(
        "def run(cfg, root, run):\n    from protege.helper import f\n    return cfg.sft.lr, cfg.world\n")
    monkeypatch.setattr(stage_deps, "PACKAGE", package)
    assert stage_deps.missing_code_deps("demo", ["protege/stages", "protege/config.py", "protege/tracking.py",
                                                 "protege/__init__.py", "protege/helper.py"]) == ["protege/other.py"]
    assert stage_deps.missing_params("demo", ["sft.steps"]) == ["sft.lr", "world"]
    assert stage_deps.missing_params("demo", ["sft", "world"]) == []


def declared_code(stage: str) -> set[str]:
    return {str(d) for d in STAGES[stage].get("deps", []) if str(d).startswith("protege/")}


def test_a_module_re_runs_only_the_stages_that_import_it():
    """dvc.yaml lists exactly each stage's import closure: editing a comment in a module (a foundation module,
    the LoRA code) re-runs the stages whose code imports it and no other."""
    for module in ("protege/stage_names.py", "protege/models/lora.py", "protege/bench/prompts.py",
                   "protege/rl/gtpo.py", "protege/rl/estimators/rloo.py"):
        importers = {s for s in STAGES if module in {str(p) for p in stage_deps.code_files(s)}}
        assert {s for s in STAGES if module in declared_code(s)} == importers, module
    # stages that never load a model do not re-run when the model code changes
    for stage in ("validate", "merge", "promote"):
        assert "protege/models/lora.py" not in declared_code(stage), stage
    # GTPO's shaping is the tool loop's (imported by the agent loop), not the question chain's; the estimator
    # registry imports every estimator, so an estimator file re-runs the RL stages, and never sft
    assert "protege/rl/code_similarity.py" not in declared_code("sft") | declared_code("rl")
    assert "protege/rl/estimators/rloo.py" in declared_code("rl") and "protege/rl/gtpo.py" not in declared_code("sft")


# --- dvc.yaml is written for the params' data source (protege/dag.py) --------------------------------

def files_config(tmp_path):
    from protege.config import Config

    return Config(data={"source": "files", "train": "mine/train.jsonl", "rl": ["mine/rl", "/abs/more_rl.parquet"],
                        "test": "mine/test.parquet", "images": "mine/images"},
                  model={"path": str(tmp_path / "model")})


def test_the_committed_dvc_yaml_is_the_params_rendering():
    from protege import dag
    from protege.config import load_config

    assert (ROOT / "dvc.yaml").read_text() == dag.render(load_config(ROOT / "params.yaml")), \
        "dvc.yaml is out of date: run `protege dag` (or dev/sync_dvc_deps.py)"


def test_files_source_puts_a_data_stage_in_place_of_the_world(tmp_path):
    from protege import dag

    spec = yaml.safe_load(dag.render(files_config(tmp_path)))["stages"]
    assert "world" not in spec and "mini_benchmarks" not in spec and list(spec)[0] == "data"
    deps = [str(d) for d in spec["data"]["deps"]]
    assert deps[:4] == ["mine/train.jsonl", "mine/rl", "/abs/more_rl.parquet", "mine/test.parquet"]
    assert "mine/images" in deps and spec["data"]["outs"][0] == {"data/imported": {"persist": True}}
    flat = yaml.safe_dump(spec)
    assert "data/world" not in flat and "models/base" not in flat and "data/benchmarks" not in flat
    assert "data/imported/train.parquet" in spec["sft"]["deps"] and "${sft.init}" not in spec["sft"]["deps"]
    assert "data/imported/rl.parquet" in spec["curate"]["deps"]
    assert not any("val.parquet" in str(d) for d in spec["rl"]["deps"])   # data.val null: no curve dependency
    assert "data/imported/test.parquet" in spec["evaluate"]["deps"]
    for stage, body in spec.items():  # every stage of the files DAG declares its code and params too
        code = [str(d) for d in body.get("deps", []) if str(d).startswith("protege/")]
        assert not stage_deps.missing_code_deps(stage, code), stage
        assert not stage_deps.missing_params(stage, [str(p) for p in body.get("params", [])]), stage


def covers(param: str, setting: str) -> bool:
    return setting == param or setting.startswith(param + ".")


def leaves(model, prefix: str) -> list[str]:
    out = []
    for key, field in model.model_fields.items():
        sub = field.annotation
        is_section = isinstance(sub, type) and hasattr(sub, "model_fields")
        out += leaves(sub, f"{prefix}.{key}") if is_section else [f"{prefix}.{key}"]
    return out


@pytest.mark.parametrize("stage,section", [("agent_sft", "agent"), ("tool_sft", "tool")])
def test_no_rl_setting_is_a_warm_starts_dependency(stage, section):
    """Every setting of the game's RL section (and its final evaluation) changes nothing the warm start writes:
    none is covered by its params, while its own SFT settings are."""
    from protege.config import Config

    game = Config.model_fields[section].annotation
    params = [str(p) for p in STAGES[stage]["params"]]
    rl = leaves(game.model_fields["rl"].annotation, f"{section}.rl") + [f"{section}.eval_episodes"]
    assert len(rl) > 30 and not [s for s in rl if any(covers(p, s) for p in params)]
    assert all(any(covers(p, s) for p in params) for s in (f"{section}.sft.lr", f"{section}.sft.steps", "seed"))
    assert {f"{section}.rl.lr", f"{section}.sft.lr"} <= {s for s in leaves(game, section)
                                                        if any(covers(p, s) for p in STAGES[f"{section}_rl"]["params"])}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_setting_that_changes_nothing_is_no_stages_dependency(stage):
    """config.py's `affects` metadata: what changes nothing a stage writes (threads, placement, sleep, offload)
    is not in any stage's params, even where the stage reads its section whole."""
    from protege.config import Config, untracked_keys

    params = [str(p) for p in STAGES[stage].get("params", [])]
    assert not [k for k in untracked_keys(Config) if any(covers(p, k) for p in params)]
