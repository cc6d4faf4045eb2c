import json
import random

import pandas as pd
from PIL import Image

from protege.config import WorldConfig
from protege.world.generate import generate_world
from protege.world.questions import KINDS, make_item
from protege.world.scenes import COLOURS, draw_scene, random_scene
from protege.world.teachers import scripted_answer


def test_same_seed_same_world(tmp_path):
    cfg = WorldConfig(n_train=10, n_rl=4, n_test=4)
    a = generate_world(cfg, tmp_path / "a")
    b = generate_world(cfg, tmp_path / "b")
    for split in a:
        pd.testing.assert_frame_equal(a[split], b[split])
    first = a["train"]["image"][0]
    assert (tmp_path / "a" / first).read_bytes() == (tmp_path / "b" / first).read_bytes()


def test_other_seed_other_world(tmp_path):
    a = generate_world(WorldConfig(n_train=10, n_rl=4, n_test=4, seed=1), tmp_path / "a")
    b = generate_world(WorldConfig(n_train=10, n_rl=4, n_test=4, seed=2), tmp_path / "b")
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


def test_every_kind_is_generated():
    rng = random.Random(0)
    assert {make_item(rng, 64).kind for _ in range(200)} == set(KINDS)


def test_scene_pixels_show_the_colour():
    rng = random.Random(5)
    scene = random_scene(rng, 64)
    img = draw_scene(scene, 64)
    assert COLOURS[scene.colour] in {img.getpixel((x, y)) for x, y in scene.positions}


def test_scripted_teachers_differ_and_are_deterministic():
    args = ("count", "3", ["1", "2", "3", "4"], "rl-000001", 0, 0.0, 0)
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

    frames = generate_world(WorldConfig(n_train=300, n_rl=60, n_test=60), tmp_path)
    keys = [(hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest(), q)
            for df in frames.values() for rel, q in zip(df["image"], df["question"])]
    assert len(keys) == len(set(keys)) == 420
