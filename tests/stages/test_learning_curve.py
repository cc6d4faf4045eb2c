"""The rl stage's learning curve on a tiny student: CSV points at steps 0, k, 2k, ..., last, MLflow-style
metrics, and a run killed after an evaluation and started again ends with the same curve, no step twice."""
import shutil

import pandas as pd
import pytest

from protege.config import Config, RLConfig
from protege.models.student import save_student
from protege.stages import rl as rl_stage
from protege.stages import rl_baseline

RL = dict(steps=5, questions_per_step=2, group_size=2, max_new_tokens=4, save_every=1, lr=1e-3, eval_every=2,
          eval_items=6, algorithm="dr_grpo")


class Killed(Exception):
    pass


class FakeRun:
    """What a stage logs to MLflow, kept in memory; `kill_at` raises once a val point of that step is logged."""

    def __init__(self, kill_at=None):
        self.metrics, self.kill_at = [], kill_at

    def log_params(self, params, prefix=""):
        pass

    def log_input(self, path, context):
        pass

    def log_model(self, path, name, params=None):
        return name

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, metrics))
        if "val_accuracy" in metrics and step == self.kill_at:
            raise Killed(step)


@pytest.fixture
def project(tiny_world, tiny_student, tiny_processor, tmp_path):
    root = tmp_path / "proj"
    shutil.copytree(tiny_world, root / "data/world")
    (root / "data/curated/images").mkdir(parents=True)
    shutil.copy(tiny_world / "rl.parquet", root / "data/curated/rl.parquet")
    shutil.copytree(tiny_world / "images/rl", root / "data/curated/images/rl")
    save_student(tiny_student, tiny_processor, root / "models/sft")
    return root


def curve(root, rel=rl_stage.CURVE):
    return pd.read_csv(root / rel)


def test_curve_points_and_resume_without_duplicates(project, tmp_path):
    cfg = Config(rl=RLConfig(**RL))
    whole = tmp_path / "whole"
    shutil.copytree(project, whole)
    run = FakeRun()
    rl_stage.run(cfg, whole, run)
    expected = curve(whole)
    assert expected["step"].tolist() == [0, 2, 4, 5]
    kinds = [c for c in expected.columns if c not in ("step", "accuracy")]
    assert kinds and expected[["accuracy", *kinds]].apply(lambda c: c.between(0, 1).all()).all()
    val_steps = [s for s, m in run.metrics if "val_accuracy" in m]
    assert val_steps == [0, 2, 4, 5]
    assert all(f"val_accuracy.{k}" in m for s, m in run.metrics if "val_accuracy" in m for k in kinds)

    # killed right after step 4's evaluation, before its state save (the last state is step 3's)
    with pytest.raises(Killed):
        rl_stage.run(cfg, project, FakeRun(kill_at=4))
    assert curve(project)["step"].tolist() == [0, 2, 4]
    again = FakeRun()
    rl_stage.run(cfg, project, again)
    assert [s for s, m in again.metrics if "val_accuracy" in m] == [4, 5]  # step 4 again, from the same weights
    pd.testing.assert_frame_equal(curve(project), expected)
    # every step's figures too: the rows before the resumed state's step are kept, the rest written again
    steps = pd.read_csv(project / "reports/rl/train_curve.csv")
    assert steps["step"].tolist() == [1, 2, 3, 4, 5] and "reward" in steps
    assert pd.read_csv(whole / "reports/rl/train_curve.csv")["step"].tolist() == [1, 2, 3, 4, 5]


def test_no_val_split_or_eval_every_0_writes_an_empty_curve_and_no_baseline_stage(project, capsys):
    (project / "data/world/val.parquet").unlink()
    cfg = Config(rl=RLConfig(**{**RL, "steps": 1}, baseline=None))
    rl_stage.run(cfg, project, FakeRun())
    assert curve(project).empty and "val.parquet is absent" in capsys.readouterr().err
    rl_baseline.run(cfg, project, FakeRun())
    assert rl_baseline.baseline_algorithm(project) is None and curve(project, rl_baseline.CURVE).empty
    assert pd.read_csv(project / "reports/rl_baseline/train_curve.csv").empty  # DVC's out, with no step
    assert not list((project / rl_baseline.RL_BASELINE).glob("step-*"))


def test_baseline_stage_runs_the_same_budget_with_its_algorithm(project):
    same = Config(rl=RLConfig(**{**RL, "steps": 2, "algorithm": "dr_grpo", "baseline": "dr_grpo"}))
    rl_baseline.run(same, project, FakeRun())  # the rl stage's own run: not trained a second time
    assert rl_baseline.baseline_algorithm(project) is None
    cfg = Config(rl=RLConfig(**{**RL, "steps": 2, "eval_every": 1, "algorithm": "grpo"}))
    run = FakeRun()
    rl_baseline.run(cfg, project, run)
    out = project / rl_baseline.RL_BASELINE
    assert rl_baseline.baseline_algorithm(project) == "dr_grpo"
    assert sorted(p.name for p in out.glob("step-*")) == ["step-00001", "step-00002"]
    assert (out / "state").exists() and not (project / "models/rl").exists()
    assert curve(project, rl_baseline.CURVE)["step"].tolist() == [0, 1, 2]
    assert (project / "reports/stages/rl_baseline.json").exists()


def test_ranks_answer_their_share_and_rank_0_writes_the_whole_point(tiny_student, tiny_processor, tiny_world,
                                                                     tmp_path, monkeypatch):
    """Two ranks answer every other row each; the counts summed over them give rank 0 exactly the point one
    process gives (accuracy and per kind), and only rank 0 writes and logs it."""
    from protege.data.rows import load_rows

    rows = load_rows(tiny_world / "val.parquet")[:7]  # odd: the ranks' shares differ in size
    one = rl_stage.LearningCurve(tmp_path / "one.csv", rows, tiny_processor, 3, 4, FakeRun())
    one(0, tiny_student)
    expected = pd.read_csv(tmp_path / "one.csv").iloc[0].to_dict()

    shares = {}

    def summed(counts):  # all_reduce_sum between the two simulated ranks: rank 1 answers first
        shares[rank["now"]] = counts.clone()
        return counts if rank["now"] == 1 else counts + shares[1]

    rank = {"now": 1}
    monkeypatch.setattr(rl_stage, "world", lambda: (rank["now"], 2))
    monkeypatch.setattr(rl_stage, "all_reduce_sum", summed)
    runs = {r: FakeRun() for r in (0, 1)}
    curves = {r: rl_stage.LearningCurve(tmp_path / f"rank{r}.csv", rows, tiny_processor, 3, 4, runs[r])
              for r in (0, 1)}
    curves[1](0, tiny_student)
    rank["now"] = 0
    curves[0](0, tiny_student)
    assert float(shares[1][0][1]) == 3 and float(shares[0][0][1]) == 4  # rows 1, 3, 5 and 0, 2, 4, 6
    got = pd.read_csv(tmp_path / "rank0.csv").iloc[0].to_dict()
    assert got == pytest.approx(expected, nan_ok=True)
    assert runs[1].metrics == [] and runs[0].metrics[0][1]["val_accuracy"] == pytest.approx(expected["accuracy"])
