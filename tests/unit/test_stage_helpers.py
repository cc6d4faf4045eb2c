import os

from protege.stages.promote import decide


def test_first_model_becomes_champion():
    assert decide(0.3, None, margin=0.0)


def test_champion_moves_only_past_the_margin():
    assert decide(0.71, 0.70, margin=0.0)
    assert not decide(0.70, 0.70, margin=0.0)  # a tie keeps the champion
    assert not decide(0.705, 0.70, margin=0.01)
    assert decide(0.72, 0.70, margin=0.01)


def test_champion_scored_elsewhere_or_without_score_stays():
    assert not decide(90.0, 10.0, margin=0.0, same_suite=False)         # another suite or protocol
    assert not decide(90.0, None, margin=0.0, has_champion=True)        # alias set by hand, no score
    assert decide(90.0, None, margin=0.0, has_champion=False)           # no champion yet


def test_discriminator_pretraining_draws_n_teacher_answers_per_question():
    import pandas as pd

    from protege.stages.disc_pretrain import balanced_teacher_answers

    student = pd.DataFrame({"question_id": ["a"] * 2 + ["b"] * 3, "answer": ["x"] * 5})
    teacher = pd.DataFrame({"question_id": ["a"] * 8 + ["b"] * 2 + ["c"] * 4,
                            "teacher": ["t1", "t2"] * 7, "answer": [f"y{i}" for i in range(14)]})
    out = balanced_teacher_answers(teacher, student, seed=0)
    assert out.groupby("question_id").size().to_dict() == {"a": 2, "b": 2}  # b has only 2 teacher answers


def test_rl_resume_state_is_tied_to_its_inputs(tmp_path):
    from protege.config import RLConfig
    from protege.paths import CURATED_RL, SFT_MODEL, SPLIT_TABLES
    from protege.rl.loop import fingerprint
    from protege.stages.common import inputs_digest
    from protege.stages.rl import input_files

    (tmp_path / SFT_MODEL).mkdir(parents=True)
    (tmp_path / SFT_MODEL / "model.safetensors").write_bytes(b"weights-1")
    (tmp_path / CURATED_RL).parent.mkdir(parents=True)
    (tmp_path / CURATED_RL).write_bytes(b"table")
    before = inputs_digest(tmp_path, input_files(tmp_path, SPLIT_TABLES["val"], ril=False))
    stat = (tmp_path / SFT_MODEL / "model.safetensors").stat()
    (tmp_path / SFT_MODEL / "model.safetensors").write_bytes(b"weights-2")  # a new SFT checkpoint, same size
    os.utime(tmp_path / SFT_MODEL / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and mtime
    after = inputs_digest(tmp_path, input_files(tmp_path, SPLIT_TABLES["val"], ril=False))
    assert before != after
    cfg = RLConfig()
    assert fingerprint(cfg, 0, before) != fingerprint(cfg, 0, after)
    assert fingerprint(cfg, 0) == fingerprint(cfg, 0, "")


def test_step_history_is_rewritten_every_step_and_kept_across_a_resume(tmp_path):
    import pandas as pd

    from protege.stages.common import StepHistory

    path = tmp_path / "reports/agent/train_curve.csv"
    h = StepHistory(path)
    assert pd.read_csv(path).columns.tolist() == ["step"]  # a file from the start (DVC expects it)
    for step in (1, 2, 3):
        h.add(step, {"reward": step / 10, **({"eval_success": 0.5} if step == 2 else {})})
    assert pd.read_csv(path)["step"].tolist() == [1, 2, 3]
    again = StepHistory(path, resumed_after=2)  # killed after step 3, its state saved at step 2
    assert again.rows == [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2, "eval_success": 0.5}]
    again.add(3, {"reward": 0.4})
    assert pd.read_csv(path)["reward"].tolist() == [0.1, 0.2, 0.4]
    assert StepHistory(path, resumed_after=0).rows == [] and pd.read_csv(path).empty  # a fresh run
