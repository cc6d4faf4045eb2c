"""The world's mini benchmarks: each of the 14 with the quirks of the real one, and unseen images."""
import hashlib
import re

from protege.bench.items import BENCHMARKS
from protege.world.benchmarks import make_mini_benchmark


def suite(n=12, avoid=None):
    avoid = set() if avoid is None else avoid
    return {name: make_mini_benchmark(name, 7, 64, n, avoid) for name in BENCHMARKS}, avoid


def test_every_benchmark_has_items_in_its_answer_format():
    s, _ = suite()
    assert set(s) == set(BENCHMARKS) and all(len(v) >= 6 for v in s.values())
    for name in ("ai2d", "mmstar", "seedbench", "seedbench2_plus", "mmmu_pro", "blink"):
        assert all(it.options and it.answer in it.options for it in s[name]), name
    assert max(len(it.options) for it in s["mmmu_pro"]) == 10
    assert all(len(it.images) == 2 for it in s["blink"])
    assert any(len(it.images) == 2 and it.question.count("<image>") == 2 for it in s["mmvet_v2"])
    assert any("<AND>" in it.answer for it in s["mmvet"]) and all(not it.options for it in s["mmvet"])
    assert all(re.fullmatch(r"\d+(\.\d)?", it.answer) for it in s["chartqa"])
    assert {it.meta["question_type"] for it in s["mathvista"]} == {"free_form", "multi_choice"}
    assert {it.meta["question_type"] for it in s["mmmu"]} == {"open", "multiple-choice"}
    assert all(re.search(r"[\u4e00-\u9fff]", it.question) for it in s["mmbench_cn"])
    assert any("\nA. " in it.question for it in s["realworldqa"])


def test_mmbench_copies_rotate_the_options_and_share_a_group():
    s, _ = suite()
    groups = {}
    for it in s["mmbench"]:
        groups.setdefault(it.group, []).append(it)
        assert it.group == str(int(it.index) % 1_000_000)
    for copies in groups.values():
        golds = {it.options[it.answer] for it in copies}
        assert len(golds) == 1 and len(copies) == len(copies[0].options)  # same answer text, every rotation
        assert len({it.answer for it in copies}) == len(copies)             # at a different letter each time


def test_images_are_new_and_reproducible():
    world_image = hashlib.sha256(b"pretend world image").hexdigest()
    s1, _ = suite(avoid={world_image})
    firsts = [it for items in s1.values() for it in items if not it.group or it.index == it.group]  # one per copy set
    digests = [hashlib.sha256(png).hexdigest() for it in firsts for png in it.images]
    assert world_image not in digests and len(set(digests)) == len(digests)
    s2, _ = suite()
    assert [it.question for it in s2["ai2d"]] == [it.question for it in s1["ai2d"]]
    assert [it.images for it in s2["chartqa"]] == [it.images for it in s1["chartqa"]]


def test_every_shape_and_colour_has_a_chinese_name():
    from protege.world.scenes import COLOURS, COLOURS_CN, SHAPES, SHAPES_CN

    assert set(SHAPES_CN) == set(SHAPES) and set(COLOURS_CN) == set(COLOURS)


def test_mini_benchmarks_draw_for_many_seeds():
    from protege.world.benchmarks import make_mini_benchmark

    for seed in range(8):  # every shape, colour and count shows up in some question
        for name in ("mmbench_cn", "mmbench", "ai2d", "realworldqa"):
            assert make_mini_benchmark(name, seed, 64, 24, set())
