import json
import random

import pandas as pd
from PIL import Image

from protege.config import WorldConfig
from protege.world.generate import generate_world
from protege.data.rows import load_rows
from protege.world.questions import ANSWERS, KINDS, Deck, make_item
from protege.world.scenes import COLOURS, draw_scene, random_scene
from protege.world.teachers import STRONG, kind_error_rate, scripted_answer


def test_same_seed_same_world(tmp_path):
    cfg = WorldConfig(n_train=10, n_rl=4, n_val=4, n_test=4)
    a = generate_world(cfg, tmp_path / "a")
    b = generate_world(cfg, tmp_path / "b")
    for split in a:
        pd.testing.assert_frame_equal(a[split], b[split])
    first = a["train"]["image"][0]
    assert (tmp_path / "a" / first).read_bytes() == (tmp_path / "b" / first).read_bytes()


def test_other_seed_other_world(tmp_path):
    a = generate_world(WorldConfig(n_train=10, n_rl=4, n_val=4, n_test=4, seed=1), tmp_path / "a")
    b = generate_world(WorldConfig(n_train=10, n_rl=4, n_val=4, n_test=4, seed=2), tmp_path / "b")
    assert list(a["train"]["question"]) != list(b["train"]["question"]) or \
        list(a["train"]["answer"]) != list(b["train"]["answer"])


def test_splits_are_disjoint_streams(tiny_world):
    train = pd.read_parquet(tiny_world / "train.parquet")
    test = pd.read_parquet(tiny_world / "test.parquet")
    assert set(train["id"]).isdisjoint(test["id"])
    assert train["id"].is_unique


def test_rows_are_consistent(tiny_world):
    df = pd.read_parquet(tiny_world / "train.parquet")
    assert set(df["kind"]) <= set(KINDS)
    for rec in df.to_dict("records"):
        assert rec["answer"] in json.loads(rec["candidates"])
        with Image.open(tiny_world / rec["image"]) as im:
            assert im.size == (64, 64)
        assert rec["answer"] in ANSWERS[rec["kind"]]


def test_every_kind_is_generated():
    rng = random.Random(0)
    assert {make_item(rng, 64).kind for _ in range(200)} == set(KINDS)


def test_scene_pixels_show_the_colour():
    rng = random.Random(5)
    scene = random_scene(rng, 64, count=3)
    img = draw_scene(scene, 64)
    assert scene.count == 3 and scene.shape and scene.colour
    assert COLOURS[scene.colour] in {img.getpixel((x, y)) for x, y in scene.positions}


def test_scripted_teachers_differ_and_are_deterministic():
    args = ("count", "3", ["1", "2", "3", "4"], "rl-000001", 0, 0.0, 0)
    assert scripted_answer("verbose", *args).startswith("3")  # no recorded facts: the answer alone
    concise = scripted_answer("concise", *args)
    verbose = scripted_answer("verbose", *args)
    assert concise == scripted_answer("concise", *args)
    assert len(verbose) > len(concise) and "3" in verbose and "3" in concise


def test_teacher_error_rate_one_is_always_wrong():
    for k in range(20):
        said = scripted_answer("concise", "count", "3", ["1", "2", "3", "4"], "q", k, 1.0, 0)
        assert "3" not in said


def test_no_example_repeats_within_or_across_splits(tmp_path):
    import hashlib

    frames = generate_world(WorldConfig(n_train=300, n_rl=60, n_val=20, n_test=60), tmp_path)
    keys = [(hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest(), q)
            for df in frames.values() for rel, q in zip(df["image"], df["question"])]
    assert len(keys) == len(set(keys)) == 440
    owner = {}
    for split, df in frames.items():  # no image is shared between splits, extra images included
        for rec in df.to_dict("records"):
            for rel in [rec["image"], *json.loads(rec["extra_images"])]:
                digest = hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest()
                assert owner.setdefault(digest, split) == split


def test_every_split_is_balanced_by_kind_and_answer(tmp_path):
    # 9 kinds x 24: every kind's answers (2, 4, 6 or 8 of them) divide 24, so no constant beats chance at all
    n = len(KINDS)
    frames = generate_world(WorldConfig(n_train=n * 24, n_rl=n * 24, n_val=n * 24, n_test=n * 24), tmp_path)
    for split, df in frames.items():
        per_kind = df["kind"].value_counts()
        assert set(per_kind.index) == set(KINDS) and per_kind.nunique() == 1, split
        for kind, group in df.groupby("kind"):
            counts = group["answer"].value_counts()
            assert set(counts.index) == set(ANSWERS[kind]), (split, kind)
            assert counts.max() == counts.min() == len(group) // len(ANSWERS[kind]), (split, kind)


def test_deck_deals_full_rounds():
    deck = Deck(random.Random(0), ["a", "b", "c"])
    dealt = [deck.deal() for _ in range(7)]
    assert sorted(dealt[:3]) == sorted(dealt[3:6]) == ["a", "b", "c"]


def test_questions_use_benchmark_formats():
    rng = random.Random(3)
    families = {}
    for _ in range(400):
        item = make_item(rng, 64)
        families.setdefault(item.family, item.question)
    assert {"ai2d", "mmbench", "mmbench_cn", "mmstar", "blink", "chartqa", "mathvista"} <= set(families)
    assert "Answer with the option's letter from the given choices directly." in families["ai2d"]
    assert "请直接使用所提供的选项字母作为答案回答。" in families["mmbench_cn"]
    assert "(A) the first image" in families["blink"]


def test_multiple_choice_gold_letter_names_the_right_option():
    rng = random.Random(1)
    for _ in range(200):
        item = make_item(rng, 64, "count_option")
        correct = item.options["ABCD".index(item.answer)]
        pixels = item.images[0].convert("RGB")
        assert int(correct) >= 1 and item.answer in "ABCD" and pixels.size == (64, 64)
        if item.difficulty == 2:  # the easy form lists its options in ascending order
            assert item.options == sorted(item.options, key=int)


def test_two_image_questions_load_as_image_lists(tmp_path):
    generate_world(WorldConfig(n_train=16, n_rl=8, n_val=8, n_test=8), tmp_path)
    rows = load_rows(tmp_path / "train.parquet")
    two = [r for r in rows if r.kind == "compare_two"]
    assert two and all(isinstance(r.image, list) and len(r.image) == 2 for r in two)
    assert all(not isinstance(r.image, list) for r in rows if r.kind != "compare_two")


def test_teachers_have_different_strengths():
    assert STRONG["concise"].isdisjoint(STRONG["verbose"])
    assert STRONG["concise"] | STRONG["verbose"] == set(KINDS)
    assert kind_error_rate("concise", "count", 0.1) == 0.1
    assert abs(kind_error_rate("concise", "colour", 0.1) - 0.3) < 1e-9
    wrong = sum("red" not in scripted_answer("concise", "colour", "red", list(COLOURS), "q", k, 0.1, 0)
                for k in range(400))
    assert 80 < wrong < 160  # 30% of 400 on a weak kind


def test_scripted_teacher_revision_follows_its_behaviour():
    from protege.teachers.backends import ScriptedTeacher

    a = ScriptedTeacher("concise", error_rate=0.1, seed=0)
    assert a.revision == ScriptedTeacher("concise", error_rate=0.1, seed=0).revision
    assert a.revision != ScriptedTeacher("concise", error_rate=0.2, seed=0).revision  # new answers: new keys
    assert a.revision != ScriptedTeacher("verbose", error_rate=0.1, seed=0).revision
    assert a.revision != ScriptedTeacher("concise", error_rate=0.1, seed=0, accounts=True).revision


def test_held_out_formats_never_reach_the_sft_pool(tmp_path):
    frames = generate_world(WorldConfig(n_train=90, n_rl=90, n_val=9, n_test=9,
                                        sft_held_out_formats=["mmstar", "mmvet"]), tmp_path)
    assert not {"mmstar", "mmvet"} & set(frames["train"]["family"])
    assert {"mmstar", "mmvet"} & set(frames["rl"]["family"])


def test_unknown_held_out_format_is_an_error():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="mmstr"):
        WorldConfig(sft_held_out_formats=["mmstr"])


def test_sft_targets_say_each_answer_in_both_teachers_styles(tmp_path):
    # the SFT student must speak like both teachers, so the pretrained discriminator starts near chance on style
    world = generate_world(WorldConfig(n_train=360, n_rl=9, n_val=9, n_test=9), tmp_path)
    train = world["train"]
    assert train["target"].notna().all()
    # each target ends with its answer after the account (world.accounts), bare or with a full stop
    assert all(t.endswith((f"Answer: {a}", f"Answer: {a}.")) for a, t in zip(train["answer"], train["target"]))
    for (kind, answer), group in train.groupby(["kind", "answer"]):
        bare = int(group["target"].str.endswith(f"Answer: {answer}").sum())
        assert abs(bare - (len(group) - bare)) <= 1, (kind, answer, bare, len(group))
    assert world["test"]["target"].isna().all() and world["rl"]["target"].isna().all()
    rows = load_rows(tmp_path / "train.parquet")
    assert [r.sft_target for r in rows] == list(train["target"]) and any(r.sft_target != r.answer for r in rows)
    assert [r.sft_target for r in load_rows(tmp_path / "test.parquet")] == list(world["test"]["answer"])


def test_a_target_that_is_not_text_names_the_row(tmp_path):
    import pytest
    from protege.errors import UserFacingError

    world = generate_world(WorldConfig(n_train=9, n_rl=9, n_val=9, n_test=9), tmp_path)
    df = world["train"].copy()
    df["target"] = [None, None, None, 7, None, None, None, None, None]
    df.to_parquet(tmp_path / "train.parquet", index=False)
    with pytest.raises(UserFacingError, match=r"train.parquet: row 3 \(id 'train-000003'\): column 'target' holds "):
        load_rows(tmp_path / "train.parquet")
