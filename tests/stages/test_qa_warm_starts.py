"""A qa study's own warm starts (`warm_start_seeds` with task: qa) on a tiny project: sft, curate, teachers,
rollouts and disc_pretrain trained once per warm-start seed by the stages' own code, resumed stage by stage,
linked into the runs of the seeds that play from them, and fingerprinted into those runs."""
import json

import pytest
import yaml

from protege.config import Config
from tests.conftest import REPO

TINY = {"world": {"n_train": 16, "n_rl": 8, "n_val": 4, "n_test": 4},
        "curate": {"select": 4},
        "sft": {"steps": 2, "batch_size": 4, "log_every": 1},
        "rollouts": {"samples_per_question": 2, "max_new_tokens": 4},
        "disc_pretrain": {"steps": 2, "batch_size": 4}}

STUDY = """
seeds: [0, 1, 2]
warm_start_seeds: [0, 7]
baseline: ril
variants:
  sft: {train: false}
  ril: {}
preconditions:
  - {name: disc_separates, variant: ril, metric: disc_pretrain.heldout_auroc, kind: above, threshold: 0.6}
claims:
  - {better: ril, than: sft, requires: [disc_separates]}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project (params seed 0) holding world .. disc_pretrain of tiny params, made by the stage recipes."""
    import torch

    from protege.stages import stage_module
    from protege.stages.common import QuietRun

    torch.set_num_threads(1)
    proj = tmp_path_factory.mktemp("qa_warm")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in TINY.items():
        params[section].update(values)
    params["seed"] = 0
    (proj / "params.yaml").write_text(yaml.safe_dump(params))
    cfg = Config.model_validate(params)
    for stage in ("world", "sft", "curate", "teachers", "rollouts", "disc_pretrain"):
        stage_module(stage).run(cfg, proj, QuietRun())
    (proj / "study.yaml").write_text(STUDY)
    return proj


@pytest.fixture(scope="module")
def study(project):
    from protege.study.spec import load_study

    return load_study(project / "study.yaml", project)


@pytest.fixture(scope="module")
def trained(study):
    """Warm start 7 trained once (warm start 0 is the project's own)."""
    from protege.study import warm_starts

    assert warm_starts.pending(study, study.runs()) == [7]
    warm_starts.ensure(study, study.runs(), log=lambda m: None)
    return warm_starts.folder(study, 7)


def ran_stages(monkeypatch):
    """Records the stages ensure() runs (and still runs them)."""
    import protege.stages as stages

    ran, real = [], stages.stage_module

    def spy(name):
        ran.append(name)
        return real(name)

    monkeypatch.setattr(stages, "stage_module", spy)
    return ran


def test_each_seed_plays_from_its_warm_start(study):
    from protege.study import warm_starts

    assert [(r.variant, r.seed, r.warm_seed) for r in study.runs()] == [
        ("sft", 0, 0), ("ril", 0, 0), ("sft", 1, 7), ("ril", 1, 7), ("sft", 2, 0), ("ril", 2, 0)]  # seed by seed
    assert warm_starts.root(study, 0) == study.project and warm_starts.root(study, None) == study.project
    assert warm_starts.model_dir(study, 7) == study.out_dir / "warm_starts/seed-7/models/sft"
    assert warm_starts.stages("qa") == ("sft", "curate", "teachers", "rollouts", "disc_pretrain")


def test_a_qa_warm_start_is_trained_once(study, trained, monkeypatch):
    from protege.study import warm_starts

    for rel in ("models/sft/config.json", "data/curated/rl.parquet", "data/teacher_answers.parquet",
                "data/rollouts/student.parquet", "models/discriminator", "reports/stages/sft.json",
                "reports/stages/disc_pretrain.json", warm_starts.DONE, warm_starts.DIGESTS):
        assert (trained / rel).exists(), rel
    assert not (trained / "models/.state").exists()
    assert warm_starts.finished(study, 7) and warm_starts.pending(study, study.runs()) == []
    assert set(warm_starts.digests(study, 7)) >= {"models/sft", "data/curated", "models/discriminator"}
    # the project's teacher cache was copied in (hard links), and it is left as it was
    project_index = (study.project / "data/teachers/concise/index.json").read_text()
    assert (trained / "data/teachers/concise/shard-000000.parquet").stat().st_ino == \
        (study.project / "data/teachers/concise/shard-000000.parquet").stat().st_ino
    # the warm start's SFT student is its own (seed 7), not the project's (seed 0)
    mine = (trained / "models/sft/model.safetensors").read_bytes()
    assert mine != (study.project / "models/sft/model.safetensors").read_bytes()

    stamp = (trained / warm_starts.DONE).stat().st_mtime_ns
    ran = ran_stages(monkeypatch)
    warm_starts.ensure(study, study.runs(), log=lambda m: None)
    assert ran == [] and (trained / warm_starts.DONE).stat().st_mtime_ns == stamp
    assert (study.project / "data/teachers/concise/index.json").read_text() == project_index


def test_an_interrupted_warm_start_goes_on_from_its_first_unfinished_stage(study, trained, monkeypatch):
    from protege.study import warm_starts

    (trained / warm_starts.DONE).unlink()
    (trained / warm_starts.MARKS / "rollouts").unlink()  # killed during rollouts
    assert not warm_starts.finished(study, 7)
    ran = ran_stages(monkeypatch)
    warm_starts.ensure(study, study.runs(), log=lambda m: None)
    assert ran == ["rollouts", "disc_pretrain"] and warm_starts.finished(study, 7)


def test_fingerprints_differ_between_warm_starts_and_enter_the_runs(study, trained, tmp_path):
    from protege.study import warm_starts
    from protege.study.runner import plan
    from protege.study.spec import load_study

    fps = {w: warm_starts.fingerprint(study, w) for w in (0, 7, 8)}
    assert len(set(fps.values())) == 3
    planned = {p.run.key: p.fingerprint for p in plan(study)}
    assert len(set(planned.values())) == 6  # seeds 0 and 2 share a warm start, not an RL seed
    # another sft setting is another warm start (and so another run), the study file unchanged
    params = yaml.safe_load((study.project / "params.yaml").read_text())
    params["sft"]["steps"] = 3
    other = tmp_path / "p"
    other.mkdir()
    (other / "params.yaml").write_text(yaml.safe_dump(params))
    for rel in ("data", "models"):
        (other / rel).symlink_to(study.project / rel)
    again = load_study(study.project / "study.yaml", other)
    assert warm_starts.fingerprint(again, 7) != fps[7]
    assert {p.run.key: p.fingerprint for p in plan(again)}["ril/seed-1"] != planned["ril/seed-1"]


def test_runs_link_their_own_warm_start(study, trained):
    from protege.study import warm_starts
    from protege.study.runner import plan, prepare_folder, required_upstream, run_upstream_metrics

    # a project lock: the runs' own lock records what they read (the warm start's SFT, the project's world)
    lock = {"schema": "2.0", "stages": {
        "world": {"cmd": "x", "outs": [{"path": "data/world", "md5": "w0rld.dir"}]},
        "sft": {"cmd": "x", "outs": [{"path": "models/sft", "md5": "pr0ject.dir", "nfiles": 3}]}}}
    (study.project / "dvc.lock").write_text(yaml.safe_dump(lock))
    try:
        runs = {p.run.key: p for p in plan(study)}
        for p in runs.values():
            prepare_folder(study, p)
        own, shared = runs["ril/seed-1"].folder, runs["ril/seed-2"].folder
        assert (shared / "data").is_symlink() and (shared / "dvc.lock").is_symlink()
        assert (shared / "models/sft").resolve() == (study.project / "models/sft").resolve()
        assert (own / "data").is_dir() and not (own / "data").is_symlink()
        for rel in ("models/sft", "models/discriminator", "data/curated", "data/teacher_answers.parquet",
                    "data/rollouts", "data/teachers"):
            assert (own / rel).resolve() == (trained / rel).resolve(), rel
        assert (own / "data/world").resolve() == (study.project / "data/world").resolve()
        assert (runs["sft/seed-1"].folder / "models/sft").resolve() == (trained / "models/sft").resolve()
        written = yaml.safe_load((own / "dvc.lock").read_text())
        assert written["stages"]["sft"]["outs"] == [{"path": "models/sft",
                                                     "md5": warm_starts.digests(study, 7)["models/sft"]}]
        assert written["stages"]["world"]["outs"][0]["md5"] == "w0rld.dir"
        from protege.tracking import input_digest

        assert input_digest(own, "models/sft") == warm_starts.digests(study, 7)["models/sft"]
    finally:
        (study.project / "dvc.lock").unlink()

    # a precondition on the discriminator reads the run's own warm start's figure
    metrics = study.project / "reports/stages/disc_pretrain.json"
    project_auroc = json.loads(metrics.read_text())["heldout_auroc"]
    ws = json.loads((trained / "reports/stages/disc_pretrain.json").read_text())
    (trained / "reports/stages/disc_pretrain.json").write_text(json.dumps({**ws, "heldout_auroc": 0.123}))
    assert run_upstream_metrics(study, runs["ril/seed-1"].run)["disc_pretrain"]["heldout_auroc"] == 0.123
    assert run_upstream_metrics(study, runs["ril/seed-2"].run)["disc_pretrain"]["heldout_auroc"] == project_auroc
    (trained / "reports/stages/disc_pretrain.json").write_text(json.dumps(ws))

    # own warm starts only: the project's SFT artifacts are not needed, its questions and base student are
    only_own = [r for r in study.runs() if r.warm_seed == 7]
    need = {str(p) for p in required_upstream(only_own, "qa", project_seed=0)}
    assert {"data/world/train.parquet", "data/world/rl.parquet", "models/base"} <= need
    assert not need & {"models/sft", "data/curated/rl.parquet", "models/discriminator", "data/teacher_answers.parquet"}
    assert {"models/sft", "models/discriminator"} <= {str(p) for p in required_upstream(study.runs(), "qa", 0)}


def test_dry_run_lists_the_warm_starts_and_their_time(study, trained, tmp_path):
    import shutil

    from protege.study import warm_starts
    from protege.study.runner import describe_warm_starts, plan, queue_estimate

    lines = describe_warm_starts(study, study.runs())
    assert lines[0] == "warm start 0: the project's own (params.yaml seed 0), linked"
    assert lines[1].startswith("warm start 7: trained")
    backup = tmp_path / "done"
    shutil.copy(trained / warm_starts.DONE, backup)
    (trained / warm_starts.DONE).unlink()
    shutil.copy(REPO / "dvc.yaml", study.project / "dvc.yaml")  # its meta.seconds: the stages without a record
    try:
        line = describe_warm_starts(study, study.runs())[1]
        assert line.startswith("warm start 7: to train: sft, curate, teachers, rollouts, disc_pretrain into ")
        assert "about" in line  # the project's stage records (sft, rollouts) and dvc.yaml's hints
        assert "after 1 warm start(s) to train" in queue_estimate([study], {study.name: plan(study)}, 1)
    finally:
        shutil.copy(backup, trained / warm_starts.DONE)
        (study.project / "dvc.yaml").unlink()
    assert "warm start" not in queue_estimate([study], {study.name: plan(study)}, 1)
