"""Benchmark prompts follow lmms-eval's default prompt per task (expected strings written out by hand)."""
from __future__ import annotations

import pytest

from protege.bench.items import BENCHMARKS, BenchItem
from protege.bench.prompts import build_prompt

OPTS = {"A": "cat", "B": "dog"}


def item(benchmark, question="What animal?", options=None, answer="A", **kw) -> BenchItem:
    return BenchItem(benchmark=benchmark, index="1", question=question, images=[], answer=answer,
                     options=dict(OPTS if options is None else options), **kw)


@pytest.mark.parametrize("benchmark", ["ai2d", "seedbench", "seedbench2_plus"])
def test_plain_multiple_choice(benchmark):
    assert build_prompt(item(benchmark)) == (
        "What animal?\nA. cat\nB. dog\nAnswer with the option's letter from the given choices directly.")


def test_hint_line_first():
    assert build_prompt(item("ai2d", hint="A farm photo.")).startswith("A farm photo.\nWhat animal?\nA. cat")


def test_mmbench_en_and_cn():
    assert build_prompt(item("mmbench", hint="A farm.")) == (
        "A farm. What animal? There are several options:\nA. cat\nB. dog\n\n"
        "Answer with the option's letter from the given choices directly.")
    assert build_prompt(item("mmbench_cn", question="什么动物？", options={"A": "猫", "B": "狗"})) == (
        "什么动物？ 有如下几个选项：\nA. 猫\nB. 狗\n\n请直接使用所提供的选项字母作为答案回答。")


def test_mmstar_keeps_inline_options():
    q = "What animal?\nOptions: A: cat, B: dog"
    assert build_prompt(item("mmstar", question=q)) == (
        q + "\nAnswer with the option's letter from the given choices directly")
    assert build_prompt(item("mmstar")) == (
        "What animal?\nOptions: A: cat, B: dog\nAnswer with the option's letter from the given choices directly")


def test_blink_note_and_choices():
    assert build_prompt(item("blink", answer="(A)")) == (
        "Note: You only need to respond with A, B without providing any additional information.\n"
        "What animal?\nSelect from the following choices.\n(A) cat\n(B) dog")


def test_realworldqa_question_as_given():
    q = "Is the light red?\nPlease answer directly with a single word or number."
    assert build_prompt(item("realworldqa", question=q, options={}, answer="Yes")) == q
    assert build_prompt(item("realworldqa")) == "What animal?\nA. cat\nB. dog"


def test_mmmu_keeps_image_markers():
    mc = item("mmmu", question="Look at <image 1>. Which animal?")
    assert build_prompt(mc) == ("Look at <image 1>. Which animal?\nA. cat\nB. dog\n\n"
                                "Answer with the option's letter from the given choices directly.")
    open_q = item("mmmu", question="How many legs in <image 1>?", options={}, answer="4")
    assert build_prompt(open_q) == "How many legs in <image 1>?\n\nAnswer the question using a single word or phrase."
    pro = item("mmmu_pro", options={chr(65 + i): str(i) for i in range(10)})
    assert build_prompt(pro).endswith("J. 9\n\nAnswer with the option letter from the given choices directly.")


def test_chartqa():
    assert build_prompt(item("chartqa", question="Max value?", options={}, answer="5")) == (
        "Max value?\nAnswer the question using a single word or phrase.")


def test_mathvista_format_prompt():
    free = item("mathvista", question="What is the length?", options={}, answer="1.5",
                meta={"question_type": "free_form", "answer_type": "float", "precision": 1, "unit": "cm"})
    assert build_prompt(free) == ("What is the length? (Unit: cm)\n"
                                  "Answer the question using a single floating-point number with one decimal place.")
    choice = item("mathvista", question="Which is longer?", options={}, answer="5 cm",
                  meta={"question_type": "multi_choice", "answer_type": "text", "choices": ["3 cm", "5 cm"]})
    assert build_prompt(choice) == ("Which is longer?\nA. 3 cm\nB. 5 cm\n"
                                    "Answer with the option's letter from the given choices directly.")
    integer = item("mathvista", question="How many?", options={}, answer="3",
                   meta={"question_type": "free_form", "answer_type": "integer"})
    assert build_prompt(integer).endswith("\nAnswer the question using a single integer number.")


def test_mmvet_and_v2_markers():
    pre = "First please perform reasoning, and think step by step to provide best answer to the following question: \n\n"
    assert build_prompt(item("mmvet", question="What is funny?", options={})) == pre + "What is funny?"
    v2 = item("mmvet_v2", question="Compare <IMG>v2_1.png<IMG> and <IMG>v2_2.jpg<IMG> please.", options={})
    assert build_prompt(v2) == pre + "Compare[<IMG_PLH>]and[<IMG_PLH>]please."


def test_every_benchmark_has_a_prompt():
    for b in BENCHMARKS:
        assert build_prompt(item(b)).strip()
    with pytest.raises(ValueError):
        build_prompt(item("mmlu"))
