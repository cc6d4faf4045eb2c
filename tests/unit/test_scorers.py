"""Benchmark-protocol scorers: hand-computed expectations for the tricky answer shapes."""
from __future__ import annotations

import pytest

from protege.errors import UserFacingError
from protege.bench.items import BENCHMARKS, BenchItem
from protege.eval.scorers import scorer_for
from protege.eval.scorers.chartqa import relaxed_match
from protege.eval.scorers.letters import (
    lmms_mmbench_letter,
    read_letter,
)
from protege.eval.scorers.lmms_mathvista import NO_JUDGE, edit_distance, normalize_extraction
from protege.eval.scorers.vlmevalkit_match import can_infer
from protege.eval.scorers.mmvet import EMPTY_NOTE, RULE_NOTE, lmms_parse_grade, parse_grade, rule_grade
from protege.eval.stats import score_of

FRUIT = {"A": "Apple", "B": "Pear", "C": "Plum", "D": "Fig"}


def mc(benchmark="ai2d", answer="B", options=None, index="1", **kw) -> BenchItem:
    return BenchItem(benchmark=benchmark, index=index, question="Which fruit is shown?", images=[],
                     answer=answer, options=dict(FRUIT if options is None else options), **kw)


def open_item(benchmark, answer, index="1", question="Q?", **kw) -> BenchItem:
    return BenchItem(benchmark=benchmark, index=index, question=question, images=[], answer=answer, **kw)


def scores(benchmark, items, preds, protocol="lmms-eval", complete=None):
    return [s.score for s in scorer_for(benchmark, protocol).score(items, preds, complete)]


class FakeLLM:
    """Test double for an external LLM: canned replies, records each batched call."""

    def __init__(self, *batches):
        self.batches = list(batches)
        self.calls: list[list[str]] = []

    def __call__(self, prompts):
        self.calls.append(list(prompts))
        return self.batches.pop(0)


# --- option letters (lmms-eval family) -------------------------------------------------------------

@pytest.mark.parametrize("response,expected", [
    ("B", "B"), ("b", "B"), ("(B)", "B"), ("B.", "B"), ("B)", "B"), ("[B]", "B"), ("**B**", "B"),
    ("B. Pear", "B"), ("Answer: B", "B"), ("The answer is C", "C"), ("the correct option is (d)", "D"), ("Correct choice: C", "C"),
    ("I think it's B", "B"), ("I think the answer is C.", "C"), ("A is correct", "A"),
    ("答案是C", "C"), ("B because the skin is green", "B"), ("It is a B-52 bomber, so C", "C"),
])
def test_read_letter_reads(response, expected):
    assert read_letter(response, FRUIT)[0] == expected


@pytest.mark.parametrize("response,note", [
    ("A cat sits on the table", "no option found"),       # article, not option A
    ("I think so", "no option found"),                      # pronoun, not option I
    ("E", "letter E beyond options"),
    ("The answer is E.", "letter E beyond options"),
    ("A and C", "hedge: A or C"),
    ("B or C", "hedge: B or C"),
    ("B/C", "hedge: B or C"),
    ("The answer is A or B.", "hedge: A or B"),
    ("Option B is better than option C", "several letters: B, C"),
    ("not B", "no option found"),
    ("I cannot tell; maybe B", "refusal"),
    ("See https://example.com/B", "no option found"),
    ("", "empty response"),
])
def test_read_letter_refuses(response, note):
    assert read_letter(response, FRUIT) == (None, note)


def test_read_letter_skips_negated_and_struck_through_letters():
    assert read_letter("It is B, not C", FRUIT) == ("B", "")
    assert read_letter("~~A~~ C", FRUIT) == ("C", "")
    assert read_letter("Not A; the answer is D", FRUIT) == ("D", "")


def test_letter_inside_words_and_option_text():
    # "Apple" holds no standalone letter; it is option A's text.
    assert read_letter("Apple", FRUIT) == ("A", "option text")
    assert read_letter("It looks like a pear.", FRUIT) == ("B", "option text")
    # Two option texts named: no answer.
    assert read_letter("Either apple or pear", FRUIT)[0] is None
    # "dark red" also contains "red": the longer text wins.
    assert read_letter("dark red", {"A": "red", "B": "dark red", "C": "blue"})[0] == "B"


def test_ten_options_i_think():
    options = {chr(ord("A") + i): f"option {i}" for i in range(10)}
    assert read_letter("I think the answer is J", options)[0] == "J"
    assert read_letter("I", options)[0] == "I"          # a bare "I" is the letter
    assert read_letter("I believe so", options)[0] is None


def test_several_letters_policy():
    assert read_letter("B or maybe C", FRUIT, several="last")[0] == "C"
    assert read_letter("B or maybe C", FRUIT, several="first")[0] == "B"
    assert read_letter("B or maybe C", FRUIT, several="reject")[0] is None


@pytest.mark.parametrize("benchmark", ["ai2d", "mmstar", "blink", "seedbench", "seedbench2_plus"])
def test_plain_mc_benchmarks(benchmark):
    items = [mc(benchmark, "B", index=str(i)) for i in range(6)]
    preds = ["B", "(b)", "Apple", "A and B", "The answer is B.", "E"]
    out = scorer_for(benchmark, "lenient").score(items, preds)
    assert [s.score for s in out] == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert [s.extracted for s in out] == ["B", "B", "A", "", "B", ""]
    assert out[3].note == "hedge: A or B"
    assert out[5].note == "letter E beyond options"


def test_blink_gold_in_parentheses():
    assert scores("blink", [mc("blink", "(C)")], ["(C) Plum"]) == [1.0]


def test_gold_not_an_option_is_user_error():
    with pytest.raises(UserFacingError, match="row 7"):
        scorer_for("ai2d").score([mc(answer="F", source="ai2d.tsv", row=7)], ["A"])


def test_lmms_eval_mc_ignores_complete():
    llm = FakeLLM(["B"])
    assert scores("ai2d", [mc()], ["no idea"], complete=llm) == [0.0]
    assert llm.calls == []


# --- RealWorldQA -----------------------------------------------------------------------------------

def test_realworldqa_open_and_inline_options():
    q_mc = "Which way is the car facing?\nA. left\nB. right\nC. towards us\nPlease answer directly with only the letter."
    items = [
        open_item("realworldqa", "Yes", "1"),
        open_item("realworldqa", "5", "2"),
        open_item("realworldqa", "5", "3"),
        open_item("realworldqa", "3", "4"),
        open_item("realworldqa", "B", "5", question=q_mc),
        open_item("realworldqa", "B", "6", question=q_mc),
        open_item("realworldqa", "No", "7"),
    ]
    preds = ["yes.", "five", "5 cars", "4", "B.", "right", "Yes, it is."]
    assert scores("realworldqa", items, preds, "lenient") == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    # lmms-eval 0.7.3: no number words, no first word, no option text for a letter gold
    assert scores("realworldqa", items, preds) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_realworldqa_options_given_by_reader():
    assert scores("realworldqa", [mc("realworldqa", "D")], ["D"]) == [1.0]


# --- MMStar aggregate -------------------------------------------------------------------------------

def test_mmstar_macro_over_l2_categories():
    s = scorer_for("mmstar")
    assert s.aggregate == "macro"
    items = [mc("mmstar", "A", index="1", category="math", l2_category="geometry"),
             mc("mmstar", "A", index="2", category="math", l2_category="geometry"),
             mc("mmstar", "A", index="3", category="math", l2_category="geometry"),
             mc("mmstar", "A", index="4", category="math", l2_category="statistics")]
    units = s.units(items, s.score(items, ["A", "A", "A", "B"]))
    assert [u.category for u in units] == ["geometry"] * 3 + ["statistics"]
    # macro: (3/3 + 0/1) / 2 = 0.5, while micro would be 3/4
    assert score_of(units, s.aggregate) == 50.0
    assert score_of(units, "micro") == 75.0
    v = scorer_for("mmstar", "vlmevalkit")
    assert v.aggregate == "micro"
    assert [u.category for u in v.units(items, v.score(items, ["A"] * 4))] == ["math"] * 4


def test_micro_default():
    for b in ("ai2d", "chartqa", "mathvista", "mmmu", "mmvet", "mmbench"):
        assert scorer_for(b).aggregate == "micro"


# --- MMBench CircularEval ---------------------------------------------------------------------------

def _rotations(group="7", category="ocr"):
    """Four copies of "What animal?" (right: cat) with the options rotated; gold follows the cat."""
    texts = ["cat", "dog", "owl", "fox"]
    items = []
    for k in range(4):
        options = dict(zip("ABCD", texts[k:] + texts[:k]))
        gold = next(letter for letter, text in options.items() if text == "cat")
        items.append(BenchItem("mmbench", str(int(group) + k * 1_000_000), "What animal?", [], gold, options,
                               category=category, group=group))
    return items


def test_rotation_golds():
    items = _rotations()
    assert [it.answer for it in items] == ["A", "D", "C", "B"]
    s = scorer_for("mmbench")  # every copy answered with its own gold: the group counts
    assert [u.score for u in s.units(items, s.score(items, ["A", "D", "C", "B"]))] == [1.0]


def test_circular_group_needs_every_copy():
    s = scorer_for("mmbench")
    items = _rotations("7") + _rotations("8", category="attr")
    preds = ["A", "D", "C", "B", "A", "D", "A", "B"]   # group 8 misses its third copy
    scored = s.score(items, preds)
    assert [x.score for x in scored] == [1, 1, 1, 1, 1, 1, 0, 1]
    units = s.units(items, scored)
    assert [(u.id, u.score, u.category) for u in units] == [("7", 1.0, "ocr"), ("8", 0.0, "attr")]


def test_circular_llm_fallback_one_batch_and_skips_failed_groups():
    items = _rotations("7") + _rotations("8")
    # group 7: copy 2 read by option text ("cat" is D there), copies 3 and 4 need the matcher;
    # group 8: copy 1 already wrong, so its unreadable copy 2 is never sent.
    preds = ["A", "It is a cat", "the furry one", "hmm", "B", "no idea", "C", "B"]
    llm = FakeLLM(["C", "Z"])
    scored = scorer_for("mmbench", "lenient").score(items, preds, llm)
    assert len(llm.calls) == 1 and len(llm.calls[0]) == 2
    assert "Answer: the furry one" in llm.calls[0][0]
    assert [x.score for x in scored] == [1, 1, 1, 0, 0, 0, 1, 1]
    assert [x.note for x in scored[:4]] == ["", "", "llm match", "unmatched"]
    assert scored[5].note == "not matched: another copy already wrong"
    units = scorer_for("mmbench").units(items, scored)
    assert [u.score for u in units] == [0.0, 0.0]


def test_circular_lmms_eval_judge_asks_three_times_with_its_prompt():
    pytest.importorskip("lmms_eval")
    items = _rotations("7")
    llm = FakeLLM(["C", "Z"], ["nothing"], ["E"])
    scored = scorer_for("mmbench").score(items, ["A", "It is a cat", "the furry one", "hmm"], llm)
    assert [len(c) for c in llm.calls] == [2, 1, 1]
    assert llm.calls[0][0].startswith("You are an AI assistant")
    assert "Question: " + items[2].question + "?\nOptions: There are several options: \nA. " in llm.calls[0][0]
    assert "Answer: the furry one\nYour output: " in llm.calls[0][0]
    assert [x.note for x in scored[2:]] == ["llm match", "llm match"]
    assert scored[3].extracted == "E" and scored[3].score == 0.0   # E = "none of them", never the gold


def test_circular_without_complete_is_unmatched():
    scored = scorer_for("mmbench_cn").score(_rotations("7"), ["A", "D", "C", "不知道"])
    assert scored[3].score == 0.0 and scored[3].note == "unmatched (lmms-eval draws a random letter)"
    scored = scorer_for("mmbench_cn", "lenient").score(_rotations("7"), ["A", "D", "C", "不知道"])
    assert scored[3].score == 0.0 and scored[3].note == "unmatched"


def test_lmms_mmbench_cn_without_a_judge_never_reads_past_can_infer():
    """mmbench_cn_dev without its GPT (it has no static task): three failed calls, then a random letter (0
    here); the lenient reader reads the same answers."""
    answers = ["It is A and it is", "A or B", "答案是A", "**A**", "A。"]
    items = [BenchItem("mmbench_cn", str(i), "Q?", [], "A", options={"A": "cat", "B": "dog"}) for i in range(5)]
    out = scorer_for("mmbench_cn").score(items, answers)
    assert [(s.score, s.note) for s in out] == [(0.0, "unmatched (lmms-eval draws a random letter)")] * 5
    lenient = scorer_for("mmbench_cn", "lenient").score(items, answers)
    assert [s.score for s in lenient] == [1.0, 0.0, 1.0, 1.0, 1.0]   # "A or B" is a hedge: no answer


def test_lmms_mmbench_en_without_a_judge_is_the_static_task():
    """mmbench_en_dev_static: where can_infer reads nothing, extract_mcq_answer among the filled options
    A-D (its start / phrase / end rules read each of these as A; "D" is not an option here)."""
    answers = ["It is A and it is", "A or B", "答案是A", "**A**", "A。", "no idea", "C or D"]
    items = [BenchItem("mmbench", str(i), "Q?", [], "A", options={"A": "cat", "B": "dog"})
             for i in range(len(answers))]
    scorer = scorer_for("mmbench")
    out = scorer.score(items, answers)
    assert [s.extracted for s in out] == ["A"] * 5 + ["", ""]
    assert [s.score for s in out] == [1.0] * 5 + [0.0, 0.0]
    assert out[3].note.startswith("static fallback") and out[6].note.startswith("unmatched")
    assert "mmbench_en_dev_static" in scorer.protocol
    scorer.score(items, answers, complete=lambda prompts: ["A"] * len(prompts))
    assert "mmbench_en_dev " in scorer.protocol   # with a judge: the GPT-matching task


def test_lmms_mmbench_quantifier_guard():
    opts = {"A": "cat", "B": "dog"}
    assert lmms_mmbench_letter("A", opts) == "A"
    assert lmms_mmbench_letter("I see A small animal", opts) is None   # bare "A" in a long response
    assert lmms_mmbench_letter("The answer is A.", opts) == "A"         # punctuated form still reads


# --- VLMEvalKit protocol ----------------------------------------------------------------------------

@pytest.mark.parametrize("answer, expected", [
    # hand-checked against VLMEvalKit's matching_util rules at d21c5e96 (options: 16 characters in all)
    ("B", "B"),
    ("The answer is (C).", "C"),                  # tokens The/answer/is/C: C among the last four
    ("**B**", "B"),
    ("I think it is C", "C"),                     # five tokens, C last
    ("C is correct here", "C"),                   # four tokens: any position
    ("C is the correct one", None),               # five tokens, C first; no option text
    ("B is my choice because the fruit is sweet and green", None),   # B too early; too long for texts
    ("A or B", None),                             # two letters; no option text
    ("b", None),                                  # lower case is not a letter token
    ("the answer is b", "B"),                     # "answer is X" in any case
    ("The answer is because Pear", "B"),          # the regex reads the b of "because" (VLMEvalKit quirk)
    ("answer is e", None),                        # the regex takes A-D only
    ("The correct answer is **D**, Fig", "D"),
    ("Apple", "A"),                               # option text
    ("Pineapple", "A"),                           # option text as a plain substring
    ("pear or plum", None),                       # two option texts
    ("A. Apple B. Pear", None),
    ("答案是B", None), ("B。", None),               # no CJK punctuation handling
    ("Cannot determine the answer from the image, maybe B", "Z"),   # a refusal sentence
    ("Z", "Z"),
    ("Failed to obtain answer via API", None),
    ("", None),
])
def test_vlmevalkit_can_infer_by_hand(answer, expected):
    assert can_infer(answer, dict(FRUIT)) == expected


def test_vlmevalkit_fifth_option_and_mmbench_refusal():
    assert can_infer("The answer is E", {**FRUIT, "E": "Kiwi"}) == "E"
    items = [mc(index=str(i)) for i in range(2)]
    out = scorer_for("ai2d", "vlmevalkit").score(items, ["Cannot determine the answer", "b"])
    assert [(s.extracted, s.score, s.note) for s in out] == [("Z", 0.0, "refused (Z)"), ("", 0.0, "unmatched")]


def test_vlmevalkit_llm_fallback_once():
    items = [mc(index=str(i)) for i in range(4)]
    preds = ["B", "A or B", "maybe the green one", "???"]
    llm = FakeLLM(["A", "B", "Failed to obtain answer via API"], ["nothing"], ["C D"])
    out = scorer_for("seedbench", "vlmevalkit").score(items, preds, llm)
    assert [len(c) for c in llm.calls] == [3, 1, 1]                     # "B" was matched by rule
    assert "Answer: maybe the green one" in llm.calls[0][1]
    assert [s.score for s in out] == [1.0, 0.0, 1.0, 0.0]
    assert [s.note for s in out] == ["", "llm match", "llm match", "unmatched (VLMEvalKit draws a random letter)"]


def test_vlmevalkit_without_complete():
    out = scorer_for("ai2d", "vlmevalkit").score([mc(), mc(index="2")], ["A or B", "Pear"])
    assert [(s.score, s.note) for s in out] == [(0.0, "unmatched"), (1.0, "")]


def test_vlmevalkit_mmmu_open_question_is_two_options():
    # VLMEvalKit's MMMU_preproc: A = the gold answer, B = "Other Answers", gold A
    items = [open_item("mmmu", "42", str(i), meta={"question_type": "open"}) for i in range(4)]
    preds = ["The result is 42.", "A", "It is 42, not 41, since the area of the triangle is half base times height",
             "B"]
    assert scores("mmmu", items, preds, protocol="vlmevalkit") == [1.0, 1.0, 0.0, 0.0]


# --- ChartQA ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("pred,target,ok", [
    ("104", "100", True), ("105", "100", True), ("106", "100", False), ("95", "100", True),
    ("45%", "45%", True), ("0.45", "45%", True),      # lmms-eval: '45%' reads as 0.45
    ("45%", "45", False), ("45", "45%", False),
    ("1,234", "1234", True), ("1,300", "1234", False), ("1,234.5", "1234", True),
    ("0", "0", True), ("0.0", "0", False), ("0.01", "0", False),   # zero target: exact string match
    ("Yes", "yes", True), ("Yes.", "yes", True), ("five", "5", False), ("Blue", "Red", False),
])
def test_chartqa_relaxed(pred, target, ok):
    assert relaxed_match(pred, target) is ok


def test_chartqa_best_over_answers():
    item = open_item("chartqa", "10", meta={"answers": ["10", "ten"]})
    assert scores("chartqa", [item, open_item("chartqa", "10")], ["ten", "ten"], "lenient") == [1.0, 0.0]
    # lmms-eval 0.7.3 compares with the row's one gold only, and "1,234" / " 10" as they stand
    assert scores("chartqa", [item, open_item("chartqa", "1234"), open_item("chartqa", "10")],
                  ["ten", "1,234", " 10"]) == [0.0, 0.0, 1.0]


# --- MathVista --------------------------------------------------------------------------------------

def mv(answer, qtype="free_form", atype="integer", precision=None, choices=None, index="1"):
    return open_item("mathvista", answer, index, question="What is x?",
                     meta={"question_type": qtype, "answer_type": atype, "precision": precision,
                           "choices": choices, "unit": ""})


def test_mathvista_rules():
    choices = ["3 cm", "5 cm", "7 cm"]
    items = [mv("5"), mv("5", index="2"), mv("1.25", atype="float", precision=2, index="3"),
             mv("1.3", atype="float", precision=1, index="4"), mv("5 cm", "multi_choice", "text", choices=choices, index="5"),
             mv("5 cm", "multi_choice", "text", choices=choices, index="6"),
             mv("[2007, 2008]", atype="list", index="7"), mv("1200", index="8"), mv("5", index="9")]
    preds = ["5", "There are five apples.", "The value is 1.249.", "1.33", "(B)", "5 cm",
             "It peaks between [2007, 2008].", "The total is 1,200 dollars", ""]
    out = scorer_for("mathvista", "lenient").score(items, preds)
    assert [s.score for s in out] == [1, 1, 1, 1, 1, 1, 1, 1, 0]
    assert out[2].extracted == "1.25" and out[4].extracted == "5 cm"
    assert out[8].note == "empty response"


def test_mathvista_without_complete_takes_last_number():
    out = scorer_for("mathvista", "lenient").score([mv("8")], ["First 3 then 5, so 8"])
    assert (out[0].score, out[0].note) == (1.0, "last number")
    out = scorer_for("mathvista", "lenient").score([mv("5 cm", "multi_choice", "text", choices=["3 cm", "5 cm"])],
                                                   ["I cannot tell"])
    assert (out[0].score, out[0].note) == (0.0, "no choice found")
    # lmms-eval without its GPT: everything but a bare value is extracted as '', which is no integer and,
    # for a multiple-choice question, nearest to the shortest choice (the first of equals)
    out = scorer_for("mathvista").score([mv("8"), mv("3 cm", "multi_choice", "text", choices=["3 cm", "5 cm"],
                                                     index="2")], ["First 3 then 5, so 8", "I cannot tell"])
    assert [(o.score, o.extracted, o.note) for o in out] == [(0.0, "", NO_JUDGE), (1.0, "3 cm", NO_JUDGE)]


def test_mathvista_llm_extraction_one_batch():
    items = [mv("3", index="1"), mv("4", index="2"), mv("2", index="3"),
             mv("5 cm", "multi_choice", "text", choices=["3 cm", "5 cm"], index="4")]
    preds = ["2 plus 1 gives 3", "9", "Between 1 and 3 is 2", "Either could be right, maybe the larger"]
    llm = FakeLLM(["3", "Extracted answer: 2\nbecause", "B"])
    out = scorer_for("mathvista", "lenient").score(items, preds, llm)
    assert len(llm.calls) == 1 and len(llm.calls[0]) == 3           # "9" was decided by rule
    assert "Model response: 2 plus 1 gives 3" in llm.calls[0][0]
    assert "Choices: (A) 3 cm (B) 5 cm" in llm.calls[0][2]
    assert [s.score for s in out] == [1.0, 0.0, 1.0, 1.0]
    assert out[0].note == "llm extraction" and out[1].note == ""


def test_mathvista_lmms_eval_path():
    pytest.importorskip("lmms_eval")
    choices = ["3 cm", "5 cm", "7 cm"]
    items = [mv("3", index="1"), mv("4", index="2"), mv("1.5", atype="float", precision=1, index="3"),
             mv("5 cm", "multi_choice", "text", choices=choices, index="4"),
             mv("7 cm", "multi_choice", "text", choices=choices, index="5"),
             mv("3 cm", "multi_choice", "text", choices=choices, index="6")]
    preds = ["2 plus 1 gives 3", " 4 ", "1.54", "(b) I think", "5 cm", ""]
    llm = FakeLLM(["3", "(B) 5 cm"])   # "4" and "1.54" are plain numbers, "5 cm" a choice, "" empty
    out = scorer_for("mathvista").score(items, preds, llm)
    assert [len(c) for c in llm.calls] == [2]
    assert llm.calls[0][0].endswith("Question: What is x?\n\n2 plus 1 gives 3\n\nExtracted answer: ")
    assert [o.extracted for o in out] == ["3", "4", "1.5", "5 cm", "5 cm", "3 cm"]
    # the empty answer maps to the choice nearest to "" (the shortest, first on ties): lmms-eval's quirk
    assert [o.score for o in out] == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]


def test_mathvista_lmms_normalisation_by_hand():
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3
    assert normalize_extraction("(c) seven", ["a", "b", "c"], "multi_choice", "text", None) == "c"
    assert normalize_extraction("seven", ["six", "seven!", "eight"], "multi_choice", "text", None) == "seven!"
    assert normalize_extraction("2.7", [], "free_form", "integer", None) == "2"
    assert normalize_extraction("1_000", [], "free_form", "integer", None) == "1000"
    assert normalize_extraction("1,000", [], "free_form", "integer", None) is None
    assert normalize_extraction("inf", [], "free_form", "integer", None) is None
    assert normalize_extraction("1.456", [], "free_form", "float", 2) == "1.46"
    assert normalize_extraction("2", [], "free_form", "float", 0) == "2.0"
    assert normalize_extraction("[1, 2]", [], "free_form", "list", None) == "[1, 2]"


# --- MMMU -------------------------------------------------------------------------------------------

def test_mmmu_multiple_choice_takes_last_letter():
    items = [mc("mmmu", "C", index=str(i)) for i in range(4)]
    preds = ["(A) is wrong, (C) is right", "C", "I think so", "Plum"]
    out = scorer_for("mmmu", "lenient").score(items, preds)
    assert [s.score for s in out] == [1.0, 1.0, 0.0, 1.0]
    assert out[2].note == "no option found"
    # lmms-eval 0.7.3 (MMMU's parser): option text only counts in responses of more than five words, and
    # where it finds nothing it draws a random letter, which we score 0
    out = scorer_for("mmmu").score(items, preds)
    assert [s.score for s in out] == [1.0, 1.0, 0.0, 0.0]
    assert out[3].note == "no option found (lmms-eval draws a random letter)"


def test_mmmu_pro_ten_options():
    options = {chr(ord("A") + i): f"value {i}" for i in range(10)}
    items = [mc("mmmu_pro", "J", options=options, index=str(i)) for i in range(3)]
    assert scores("mmmu_pro", items, ["J", "The answer is J.", "K"]) == [1.0, 1.0, 0.0]


def test_mmmu_open():
    items = [open_item("mmmu", "1,200", str(1)), open_item("mmmu", "5", "2"), open_item("mmmu", "copper", "3"),
             open_item("mmmu", "['3.5', '7/2']", "4"), open_item("mmmu", "12", "5"), open_item("mmmu", "b", "6")]
    preds = ["The total is 1200 dollars.", "so the answer is five", "The wire is made of Copper.",
             "x = 3.50", "The answer is 13.", "It is an apple"]
    assert scores("mmmu", items, preds, "lenient") == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    # lmms-eval 0.7.3: no number words; any element of a list-typed gold counts (eval_open), but a gold
    # written as a list in a text cell stays that text, which "x = 3.50" does not contain
    assert scores("mmmu", items, preds) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    listed = [open_item("mmmu", "3", "7", meta={"answers": ["3", "three"]}), open_item("mmmu", "['3', 'three']", "8")]
    assert scores("mmmu", listed, ["three", "The answer is three."]) == [1.0, 0.0]
    assert scores("mmmu", listed, ["three", "The answer is three."], "lenient") == [1.0, 1.0]


def test_mmmu_open_list_gold_any_element_by_hand():
    # lmms-eval 0.7.3 eval_open on a list gold: each element through normalize_str ("3" -> 3.0, "three" ->
    # "three"); right when a string element is inside a string candidate or a number element equals a
    # number candidate. Candidates (parse_open_response): "three" -> ["three"]; "The answer is 3." -> tail
    # "3" -> [3.0]; "four" -> ["four"]; "x = 0.50" -> tail "0.50" -> [0.5]
    gold = ["3", "three"]
    items = [open_item("mmmu", str(gold), str(i), meta={"answers": gold}) for i in range(3)]
    assert scores("mmmu", items, ["three", "The answer is 3.", "four"]) == [1.0, 1.0, 0.0]
    # a list handed as the answer itself counts the same; an empty list accepts nothing
    as_answer = [open_item("mmmu", ["1/2", "0.5"], "a"), open_item("mmmu", "[]", "b", meta={"answers": []})]
    assert scores("mmmu", as_answer, ["x = 0.50", "[]"]) == [1.0, 0.0]
    # the same list written in a text cell stays that text (lmms-eval does not parse doc["answer"]): none
    # of the candidates contains "['3', 'three']"; the lenient protocol parses it
    written = [open_item("mmmu", "['3', 'three']", str(i)) for i in range(3)]
    assert scores("mmmu", written, ["three", "The answer is 3.", "four"]) == [0.0, 0.0, 0.0]
    assert scores("mmmu", written, ["three", "The answer is 3.", "four"], "lenient") == [1.0, 1.0, 0.0]
    # a list-looking text that does not parse is one plain string under either protocol, never an error
    broken = [open_item("mmmu", "['3', three", "c")]
    assert scores("mmmu", broken, ["It is ['3', three"]) == [1.0]
    assert scores("mmmu", broken, ["three"]) == [0.0]
    assert scores("mmmu", broken, ["three"], "lenient") == [0.0]


def test_mmmu_mc_without_options_is_user_error():
    with pytest.raises(UserFacingError):
        scorer_for("mmmu").score([open_item("mmmu", "A", meta={"question_type": "multiple-choice"})], ["A"])


# --- MM-Vet -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("reply,grade", [("0.7", 0.7), ("1.0", 1.0), ("0", 0.0), ("1", 1.0), (" 0.5 \n", 0.5),
                                         ("0.4.", 0.4), ("1.5", None), ("high", None), ("0.5/1", None), ("", None)])
def test_parse_grade(reply, grade):
    assert parse_grade(reply) == grade


@pytest.mark.parametrize("answer,pred,grade", [
    ("3", "There are three dogs.", 1.0),
    ("-1<AND>-5", "x = -1 or x = -5", 1.0),
    ("-1<AND>-5", "x = -5", 0.5),
    ("-1<AND>-5", "x = 3", 0.0),
    ("umbrella<OR>parasol", "a parasol", 1.0),
    ("umbrella<OR>parasol", "a stick", 0.0),
    ("The sign says stop", "I think the sign says STOP.", 1.0),
    ("The sign says stop because the road ends", "It says stop because the road ends here", 0.5),  # 5/6 words
    ("The sign warns drivers about falling rocks ahead", "A warning about rocks for drivers", 0.0),  # 3/7
])
def test_mmvet_rule_grade(answer, pred, grade):
    assert rule_grade(answer, pred) == grade


def test_mmvet_rule_judge_note():
    out = scorer_for("mmvet").score([open_item("mmvet", "3")], ["three"])
    assert (out[0].score, out[0].note) == (1.0, RULE_NOTE)


def test_mmvet_judge_retries_unparsable_once():
    items = [open_item("mmvet_v2", "Paris<AND>Berlin", str(i), meta={"capability": ["rec", "ocr"]}) for i in range(3)]
    llm = FakeLLM(["0.5", "great answer", "2.0"], ["1.0", "still no"])
    out = scorer_for("mmvet_v2", "lenient").score(items, ["Paris", "Paris and Berlin", "Rome"], llm)
    assert [len(c) for c in llm.calls] == [3, 2]
    assert "Paris <AND> Berlin | Paris |" in llm.calls[0][0]
    assert [s.score for s in out] == [0.5, 1.0, 0.0]
    assert [s.note for s in out] == ["judge", "judge", "judge reply unusable"]
    units = scorer_for("mmvet_v2").units(items, out)
    assert units[0].category == "rec,ocr"


def test_mmvet_lmms_eval_reading_of_grades():
    pytest.importorskip("lmms_eval")
    assert [lmms_parse_grade(r) for r in ["0.5", " 1.0 because", "0.5\nbecause", "1e-1", "nan", "1.5", "-0"]] == [
        0.5, 1.0, None, 0.1, None, None, 0.0]
    items = [open_item("mmvet", "Paris<AND>Berlin", str(i)) for i in range(2)]
    # "high" is no number: lmms-eval asks again at temperature 0.5, drops that reply (0.9), asks once more
    llm = FakeLLM(["0.5", "high"], ["0.9"], ["0.3"])
    out = scorer_for("mmvet").score(items, ["Paris ", "Rome"], llm)
    assert [len(c) for c in llm.calls] == [2, 1, 1]
    assert llm.calls[0][0].endswith("\nQ? | Paris <AND> Berlin | Paris |")   # stripped by the harness only
    assert [s.score for s in out] == [0.5, 0.3]
    # four unreadable grades (temperatures 0 to 1.5), each followed by the dropped ask: 0 at temperature 2
    llm = FakeLLM(*[["no"]] * 8)
    out = scorer_for("mmvet").score(items[:1], ["Rome"], llm)
    assert (len(llm.calls), out[0].score, out[0].note) == (8, 0.0, "judge reply unusable")


def test_mmvet_lmms_eval_blank_reply_scores_zero_after_get_chat_responses_patience():
    pytest.importorskip("lmms_eval")
    item = [open_item("mmvet", "Paris")]
    llm = FakeLLM([""], ["  "], [""])          # get_chat_response asks three times, then returns ''
    out = scorer_for("mmvet").score(item, ["Paris"], llm)
    assert len(llm.calls) == 3 and (out[0].score, out[0].note) == (0.0, EMPTY_NOTE)
    llm = FakeLLM([""], ["0.4"])                 # a blank reply, then a grade: the grade counts
    assert scorer_for("mmvet").score(item, ["Paris"], llm)[0].score == 0.4


# --- registry ---------------------------------------------------------------------------------------

def test_every_benchmark_has_a_scorer():
    for b in BENCHMARKS:
        s = scorer_for(b)
        assert s.benchmark == b and s.protocol.startswith("lmms-eval") and s.aggregate in ("micro", "macro")


def test_scorer_for_errors():
    with pytest.raises(ValueError, match="unknown benchmark 'mmlu'"):
        scorer_for("mmlu")
    with pytest.raises(ValueError, match="unknown scoring protocol 'opencompass'"):
        scorer_for("ai2d", "opencompass")
    with pytest.raises(ValueError, match="multiple-choice benchmarks only"):
        scorer_for("chartqa", "vlmevalkit")
    assert scorer_for("mmbench", "vlmevalkit").protocol.startswith("vlmevalkit")


def test_length_mismatch():
    with pytest.raises(ValueError, match="1 items but 2 predictions"):
        scorer_for("ai2d").score([mc()], ["A", "B"])


def test_suite_wide_vlmevalkit_protocol_leaves_open_benchmarks_on_lmms_eval():
    from protege.eval.scorers import suite_protocol

    assert suite_protocol("mmbench", "vlmevalkit") == "vlmevalkit"
    assert suite_protocol("chartqa", "vlmevalkit") == "lmms-eval"
    assert suite_protocol("mmvet", "lmms-eval") == "lmms-eval"
    for name in ("chartqa", "mathvista", "mmvet", "mmvet_v2"):
        assert scorer_for(name, suite_protocol(name, "vlmevalkit")).benchmark == name


# --- lmms-eval's path from a response to its task's rule --------------------------------------------

@pytest.mark.parametrize("raw, seen", [
    ("B\n", "B"), ("  45% ", "45%"), ("<think>maybe A</think>\nB", "B"), ("I guess </think> B", "B"),
    ("<analysis>x</analysis>C", "C"), ("<think>never closed B", "<think>never closed B"),
    ("<THINK>case</THINK>B", "<THINK>case</THINK>B"), ("</think>A<think>B", "</think>A<think>B"),
    ("<think>a</think>x<think>b</think>y", "xy"), (None, ""),
])
def test_lmms_response_is_what_the_task_receives(raw, seen):
    from protege.eval.scorers.lmms_pipeline import lmms_response

    assert lmms_response(raw) == seen


def test_lmms_ai2d_filter_runs_before_the_strip():
    from protege.eval.scorers.lmms_pipeline import ai2d_filter, lmms_response

    assert [lmms_response(r, ai2d_filter) for r in [" C. cat", "c. cat", "B\n", "<think>A. x</think>B."]] == [
        "C", "c. cat", "B", "B."]
    items = [mc("ai2d", "B", index=str(i)) for i in range(6)]
    assert scores("ai2d", items, ["B\n", " B", "(b)\n", "B )", "<think>A</think>B.", "The answer is B"]) == [
        1.0, 1.0, 1.0, 0.0, 1.0, 0.0]


def test_lmms_chartqa_strips_before_relaxed_correctness():
    items = [open_item("chartqa", "0.45", str(i)) for i in range(4)]
    preds = ["45% ", " 0.45\n", "<think>0.9</think>0.46", "0.45 apples"]
    assert scores("chartqa", items, preds) == [1.0, 1.0, 1.0, 0.0]
