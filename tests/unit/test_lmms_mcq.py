"""lmms-eval 0.7.3's letter reading, rewritten: hand-worked cases (the differential tests compare it with
lmms-eval's own function on generated answers)."""
import pytest

from protege.eval.scorers import scorer_for
from protege.eval.scorers.lmms_mcq import lmms_mcq_letter
from tests.unit.test_scorers import mc, open_item

ABCD = ("A", "B", "C", "D")


@pytest.mark.parametrize("response, letter", [
    ("", ""),
    ("   ", ""),
    ("B", "B"),                                  # start (10)
    ("The correct answer is (B).", "B"),         # phrase (7) beats parentheses (6)
    ("A and B", "A"),                            # start (10) beats end (9)
    ("I think the answer is C because D is wrong", "D"),  # letters after the phrase: the latest wins
    ("(b)", ""),                                 # lower case is never a choice
    ("Dog", "D"),                                # nothing else found: any occurrence (fallback)
    ("答案是B", "B"),                             # phrase; no "end": 是 counts as a letter
    ("Options C. or D.", "D"),                   # period (5) twice: the later one wins
    ("E", ""),                                   # not among A-D, and no A-D anywhere
    ('"B."', "B"),                               # quotes are stripped last: the period stays, start wins
])
def test_hand_worked(response, letter):
    assert lmms_mcq_letter(response, ABCD) == letter


def test_default_choices_reach_h():
    assert lmms_mcq_letter("H") == "H"
    assert lmms_mcq_letter("H", ABCD) == ""


def test_mmstar_exact_and_lenient_differ_where_documented():
    items = [mc("mmstar", "B", index=str(i)) for i in range(4)]
    preds = ["(b)", "A and B", "The answer is B.", "Dog"]
    exact = scorer_for("mmstar").score(items, preds)
    assert [s.score for s in exact] == [0.0, 0.0, 1.0, 0.0]
    assert [s.extracted for s in exact] == ["", "A", "B", "D"]
    assert exact[0].note == "no option found"
    assert [s.score for s in scorer_for("mmstar", "lenient").score(items, preds)] == [1.0, 0.0, 1.0, 0.0]


def test_realworldqa_lower_case_letter_gold_and_open_gold():
    items = [open_item("realworldqa", "b", "1", question="Which?\nA. x\nB. y"), open_item("realworldqa", "2", "2"),
             open_item("realworldqa", "Downhill", "3")]
    out = scorer_for("realworldqa").score(items, ["B", "two", "downhill.."])
    assert [s.score for s in out] == [1.0, 0.0, 1.0]


def test_protocol_names_say_which():
    assert scorer_for("mmstar").protocol.startswith("lmms-eval 0.7.3")
    assert scorer_for("chartqa", "lenient").protocol.startswith("lenient: ")
    with pytest.raises(ValueError, match="unknown scoring protocol 'strict'"):
        scorer_for("mmstar", "strict")
