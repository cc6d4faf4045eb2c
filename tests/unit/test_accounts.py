"""The scripted teachers' grounded accounts and the weaker source of the SFT targets."""
import json
import random
import re

import pytest

from protege.config import WorldConfig
from protege.rewards.judge import extract, rule_judge
from protege.world.generate import generate_world
from protege.world.questions import make_item
from protege.world.scenes import COLOURS
from protege.world.teachers import scripted_answer, sft_target

SCENE = {"scene": {"shape": "circle", "colour": "red", "count": 3}}
COUNTS = [str(i) for i in range(1, 9)]
# every wording of "3 red circles" per style, then the final answer (concise: bare; verbose: a full stop)
THREE_RED_CIRCLES = {"concise": {"3 red circles.", "3 red circles here."},
                     "verbose": {"I see 3 red circles.", "There are 3 red circles.", "It shows 3 red circles."}}


def split(text: str) -> tuple[str, str]:
    """(account, final answer) of an answer with an account."""
    account, _, final = text.rpartition(" Answer: ")
    assert account and final, text
    return account, final


@pytest.mark.parametrize("style,end", [("concise", ""), ("verbose", ".")])
def test_a_right_teacher_states_what_the_image_shows_then_the_answer(style, end):
    said = [scripted_answer(style, "count", "3", COUNTS, "q1", k, 0.0, 0, SCENE) for k in range(30)]
    assert {split(t)[1] for t in said} == {"3" + end}
    accounts = {split(t)[0] for t in said}
    assert accounts <= THREE_RED_CIRCLES[style] and len(accounts) > 1  # varied wording, drawn per sample
    one = {"scene": {"shape": "diamond", "colour": "blue", "count": 1}}
    assert scripted_answer("verbose", "shape", "diamond", ["circle", "square", "triangle", "diamond"], "q", 0, 0.0,
                           0, one).split(" Answer: ")[0] in {"I see 1 blue diamond.", "There is 1 blue diamond.",
                                                             "It shows 1 blue diamond."}


def test_accounts_of_every_kind_by_hand():
    options = {"scene": {"shape": "square", "colour": "green", "count": 2}, "options": ["circle", "square",
                                                                                          "triangle", "diamond"]}
    text = scripted_answer("concise", "shape_option", "B", list("ABCD"), "q", 0, 0.0, 0, options)
    assert text in {"2 green squares. Option B. Answer: B", "2 green squares here. Option B. Answer: B"}
    chart = {"bars": {"red": 2, "green": 5, "blue": 1, "yellow": 4}, "bar": "green", "options": ["1", "3", "4", "5"]}
    assert scripted_answer("verbose", "chart_value", "5", [str(i) for i in range(1, 7)], "q", 0, 0.0, 0, chart) in \
        {"The green bar reaches 5. Answer: 5.", "The green bar is 5. Answer: 5."}
    assert scripted_answer("concise", "chart_option", "D", list("ABCD"), "q", 0, 0.0, 0, chart) in \
        {"Green bar at 5. Option D. Answer: D", "Green bar: 5. Option D. Answer: D"}
    pair = {"scenes": [{"shape": "circle", "colour": "red", "count": 1},
                       {"shape": "square", "colour": "blue", "count": 6}]}
    assert scripted_answer("verbose", "compare_two", "B", ["A", "B"], "q", 0, 0.0, 0, pair) in \
        {"I count 1 shape, then 6. Answer: B.", "I see 1 shape, then 6. Answer: B."}
    asked = {**SCENE, "asked": {"colour": "red"}}
    assert split(scripted_answer("verbose", "yes_no", "Yes", ["Yes", "No"], "q", 0, 0.0, 0, asked)) in \
        {(a, "Yes.") for a in THREE_RED_CIRCLES["verbose"]}


def test_a_wrong_teacher_gets_account_and_answer_wrong_together():
    for k in range(20):  # error rate 1: always wrong, and the account leads to the wrong answer
        text = scripted_answer("concise", "count", "3", COUNTS, "q", k, 1.0, 0, SCENE)
        account, final = split(text)
        assert final != "3" and rule_judge("3", text, COUNTS) == 0.0
        n = int(final)
        assert account in {f"{n} red circle{'s' * (n != 1)}.", f"{n} red circle{'s' * (n != 1)} here."}
    chart = {"bars": {"red": 2, "green": 5, "blue": 1, "yellow": 4}, "bar": "green", "options": ["1", "3", "4", "5"]}
    for k in range(20):  # a wrong letter comes with the bar height its option lists
        account, final = split(scripted_answer("concise", "chart_option", "D", list("ABCD"), "q", k, 1.0, 0, chart))
        value = chart["options"]["ABCD".index(final)]
        assert final != "D" and account in {f"Green bar at {value}. Option {final}.",
                                            f"Green bar: {value}. Option {final}."}
    pair = {"scenes": [{"shape": "circle", "colour": "red", "count": 2},
                       {"shape": "square", "colour": "blue", "count": 6}]}
    for k in range(10):  # the other image counted as the fuller one
        assert scripted_answer("concise", "compare_two", "B", ["A", "B"], "q", k, 1.0, 0, pair) in \
            {"6 shapes, then 2. Answer: A", "6 shapes against 2. Answer: A"}


def test_a_wrong_yes_no_account_sees_what_leads_to_the_wrong_answer():
    truly_yes = {"scene": {"shape": "circle", "colour": "red", "count": 3},
                 "asked": {"colour": "red", "shape": "circle"}}
    truly_no = {"scene": {"shape": "circle", "colour": "red", "count": 3}, "asked": {"colour": "blue"}}
    for k in range(20):
        account, final = split(scripted_answer("concise", "yes_no", "Yes", ["Yes", "No"], "q", k, 1.0, 0, truly_yes))
        assert final == "No" and not re.search(r"\bred circles\b", account)  # one asked respect seen otherwise
        assert re.fullmatch(r"3 (red|green|blue|yellow) (circle|square|triangle|diamond)s( here)?\.", account)
        account, final = split(scripted_answer("concise", "yes_no", "No", ["Yes", "No"], "q", k, 1.0, 0, truly_no))
        assert final == "Yes" and account in {"3 blue circles.", "3 blue circles here."}  # sees what is asked


def test_error_rates_apply_per_kind_to_account_and_answer_together():
    colour = {"scene": {"shape": "circle", "colour": "red", "count": 3}}
    texts = [scripted_answer("concise", "colour", "red", list(COLOURS), "q", k, 0.1, 0, colour) for k in range(400)]
    wrong = [t for t in texts if split(t)[1] != "red"]
    assert 80 < len(wrong) < 160  # 30% of 400 on the concise teacher's weak kind
    for t in texts:  # account and answer agree, and the facts the answer does not rest on stay right
        account, final = split(t)
        assert re.fullmatch(rf"3 {final} circles( here)?\.", account)


def test_the_judge_reads_only_the_final_answer():
    assert extract("I see 5 red circles. Answer: 3", COUNTS) == "3"
    assert extract("I count 6 shapes, then 4. Answer: A.", ["A", "B"]) == "A"
    assert extract("The green bar reaches 4. Option B. Answer: B.", list("ABCD")) == "B"
    assert extract("Option C shows 2 red squares. Answer: D", list("ABCD")) == "D"
    assert extract("There are 4 blue diamonds. Answer: No.", ["Yes", "No"]) == "No"
    assert rule_judge("red", "It shows 2 red circles. Answer: red.", list(COLOURS)) == 1.0
    assert rule_judge("3", "3 red circles.", COUNTS) == 1.0  # no marker (cut off before it): the text is read


def test_world_teachers_ground_their_accounts_in_the_recorded_facts(tmp_path):
    world = generate_world(WorldConfig(n_train=9, n_rl=90, n_val=9, n_test=9), tmp_path)
    for rec in world["rl"].to_dict("records"):
        facts, cands = json.loads(rec["facts"]), json.loads(rec["candidates"])
        for teacher in ("concise", "verbose"):
            text = scripted_answer(teacher, rec["kind"], rec["answer"], cands, rec["id"], 0, 0.0, 0, facts)
            assert rule_judge(rec["answer"], text, cands) == 1.0 and extract(text, cands) == rec["answer"]
            account = split(text)[0]
            if "scene" in facts:
                s = facts["scene"]
                assert re.search(rf"\b{s['count']} {s['colour']} {s['shape']}s?\b", account), (rec["kind"], text)
            elif "bars" in facts:
                assert f"{facts['bar']} bar" in account.lower()
                assert re.search(rf"\b{facts['bars'][facts['bar']]}\.", account), text
            else:
                a, b = (s["count"] for s in facts["scenes"])
                assert re.search(rf"\b{a} shapes?\b.*\b{b}\.", account), text
            if rec["kind"].endswith("_option"):
                assert f"Option {rec['answer']}." in account


def test_recorded_facts_match_the_picture():
    rng = random.Random(7)
    for _ in range(60):
        item = make_item(rng, 64, rng.choice(["colour", "count", "chart_value"]))
        pixels = {rgb for _, rgb in item.images[0].convert("RGB").getcolors(64 * 64)}
        if "scene" in item.facts:  # the recorded colour is drawn, no other is
            drawn = {name for name, rgb in COLOURS.items() if rgb in pixels}
            assert drawn == {item.facts["scene"]["colour"]}
            assert item.facts["scene"]["count"] >= 1 and item.facts["scene"]["shape"]
        else:  # a bar's recorded value is its height in units of (64 - 8) // 6 = 9 pixels
            img = item.images[0].convert("RGB")
            for colour, value in item.facts["bars"].items():
                rows = {y for x in range(64) for y in range(64) if img.getpixel((x, y)) == COLOURS[colour]}
                assert len(rows) == value * 9, (colour, value)


def wording(account: str) -> str:
    """An account with its facts (numbers, colours, shapes, option letters) blanked out."""
    return re.sub(r"\b(\d|[A-D]|red|green|blue|yellow|circles?|squares?|triangles?|diamonds?|is|are|shapes?)\b", "#",
                  account, flags=re.IGNORECASE)


def accounts_of(style: str, kind: str, facts: dict, letter: str) -> set[str]:
    """Every account a right speaker can give (hand-listed wordings)."""
    from protege.world.teachers import account

    return {account(style, kind, facts, letter, random.Random(seed)) for seed in range(40)}


def test_sft_targets_come_from_a_weaker_source_in_the_same_format(tmp_path):
    from protege.world.teachers import unnoticed

    cfg = WorldConfig(n_train=900, n_rl=9, n_val=9, n_test=9)
    assert cfg.accounts and (cfg.sft_account_vague, cfg.sft_account_error) == (0.4, 0.2)
    train = generate_world(cfg, tmp_path)["train"]
    vague = misreported = 0
    for rec in train.to_dict("records"):
        account, final = split(rec["target"])
        assert final in (rec["answer"], rec["answer"] + ".")  # the answer is the reference, in either style
        style = "concise" if final == rec["answer"] else "verbose"
        facts = json.loads(rec["facts"])
        right = accounts_of(style, rec["kind"], facts, rec["answer"])
        if account in accounts_of(style, rec["kind"], unnoticed(rec["kind"], facts), rec["answer"]):
            vague += 1
        elif account not in right:
            misreported += 1
            assert wording(account) in {wording(a) for a in right}  # a teacher's wording, one fact changed
    assert 0.33 < vague / len(train) < 0.47  # sft_account_vague 0.4
    assert 0.14 < misreported / len(train) < 0.26  # sft_account_error 0.2: 0.6 in all, above the teachers' 0.1


def test_sft_accounts_left_vague_by_hand():
    def vague(style, kind, answer, facts):
        return split(sft_target(style, kind, answer, facts, "q", 0.0, 0, 1.0))

    assert vague("concise", "count", "3", SCENE) in {("Some red circles.", "3"), ("Some red circles here.", "3")}
    assert vague("verbose", "colour", "red", SCENE) in {("I see 3 coloured circles.", "red."),
                                                        ("There are 3 coloured circles.", "red."),
                                                        ("It shows 3 coloured circles.", "red.")}
    both = {**SCENE, "asked": {"colour": "red", "shape": "circle"}}
    assert vague("concise", "yes_no", "Yes", both) in {("3 coloured shapes.", "Yes"), ("3 coloured shapes here.", "Yes")}
    chart = {"bars": {"red": 2, "green": 5}, "bar": "green", "options": ["1", "3", "4", "5"]}
    assert vague("concise", "chart_option", "D", chart) in {("Green bar at some height. Option D.", "D"),
                                                            ("Green bar: some height. Option D.", "D")}
    pair = {"scenes": [{"shape": "circle", "colour": "red", "count": 2},
                       {"shape": "square", "colour": "blue", "count": 6}]}
    assert vague("verbose", "compare_two", "B", pair) in {("I count some shapes, then some.", "B."),
                                                          ("I see some shapes, then some.", "B.")}


def test_account_shares_add_up_to_at_most_one():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="add up to at most 1"):
        WorldConfig(sft_account_vague=0.7, sft_account_error=0.4)


def test_sft_accounts_misreport_one_fact_at_a_time_and_none_at_zero():
    facts = {"scene": {"shape": "circle", "colour": "red", "count": 3}}
    for k in range(30):
        account, final = split(sft_target("concise", "count", "3", facts, f"q{k}", 1.0, 0))
        assert final == "3"
        m = re.fullmatch(r"(\d) (\w+) (\w+?)s?( here)?\.", account)
        assert sum([m.group(1) != "3", m.group(2) != "red", m.group(3) != "circle"]) == 1, account
    assert all(split(sft_target("verbose", "count", "3", facts, f"q{k}", 0.0, 0))[0] in THREE_RED_CIRCLES["verbose"]
               for k in range(30))


def test_accounts_off_and_facts_missing_give_the_bare_answer(tmp_path):
    train = generate_world(WorldConfig(n_train=36, n_rl=9, n_val=9, n_test=9, accounts=False), tmp_path)["train"]
    assert all(t in (a, a + ".") for a, t in zip(train["answer"], train["target"]))
    assert scripted_answer("verbose", "count", "3", COUNTS, "q", 0, 0.0, 0, None) == "3."
    assert scripted_answer("verbose", "count", "3", COUNTS, "q", 0, 0.0, 0, {"bars": {}}) == "3."
    assert sft_target("concise", "count", "3", {}, "q", 0.3, 0) == "3"


def test_accounts_are_deterministic():
    a = [scripted_answer("verbose", "count", "3", COUNTS, "q", k, 0.3, 5, SCENE) for k in range(10)]
    assert a == [scripted_answer("verbose", "count", "3", COUNTS, "q", k, 0.3, 5, SCENE) for k in range(10)]
    assert a != [scripted_answer("verbose", "count", "3", COUNTS, "q", k, 0.3, 6, SCENE) for k in range(10)]
    assert sft_target("verbose", "count", "3", SCENE, "q", 0.5, 1) == sft_target("verbose", "count", "3", SCENE,
                                                                                  "q", 0.5, 1)


def test_a_scripted_teacher_reads_the_facts_of_a_request_only_with_accounts():
    from protege.teachers.backends import ScriptedTeacher, TeacherRequest

    req = TeacherRequest("k", "q", "How many?", None, "count", "3", tuple(COUNTS), 0, (), json.dumps(SCENE))
    got = {}
    ScriptedTeacher("verbose", 0.0, 0, accounts=True).run([req], lambda o: got.update(on=o.text))
    ScriptedTeacher("verbose", 0.0, 0).run([req], lambda o: got.update(off=o.text))
    assert split(got["on"]) in {(a, "3.") for a in THREE_RED_CIRCLES["verbose"]} and got["off"] == "3."
    assert ScriptedTeacher("verbose", 0.0, 0, accounts=True).revision != ScriptedTeacher("verbose", 0.0, 0).revision


def test_every_answer_fits_the_new_token_limits(tmp_path):
    from protege.config import Config, load_config
    from protege.models.tokenizer import train_tokenizer
    from protege.world.generate import vocabulary_texts
    from tests.conftest import REPO

    world = generate_world(WorldConfig(n_train=180, n_rl=90, n_val=9, n_test=9), tmp_path)
    tok = train_tokenizer(vocabulary_texts(world["train"]), 1024)
    texts = list(world["train"]["target"])
    for rec in world["rl"].to_dict("records"):
        texts += [scripted_answer(t, rec["kind"], rec["answer"], json.loads(rec["candidates"]), rec["id"], k, 0.5, 0,
                                  json.loads(rec["facts"])) for t in ("concise", "verbose") for k in range(4)]
    longest = max(len(tok(t)["input_ids"]) + 1 for t in texts)  # + the end of turn
    assert longest <= 15
    for cfg in (Config(), load_config(REPO / "params.yaml")):
        assert min(cfg.rollouts.max_new_tokens, cfg.rl.max_new_tokens, cfg.evaluate.max_new_tokens) >= longest


def test_the_teachers_stage_hands_each_question_its_facts(tiny_world, tiny_processor):
    import pandas as pd

    from protege.data.rows import image_paths
    from protege.stages.teachers import requests_for
    from protege.teachers.backends import ScriptedTeacher

    table = tiny_world / "rl.parquet"
    questions = pd.read_parquet(table)
    hashes = {rel: rel for rec in questions.to_dict("records") for rel in image_paths(rec)}
    teacher = ScriptedTeacher("concise", 0.0, 0, accounts=True)
    reqs = requests_for(questions, table, hashes, teacher, tiny_processor, 1)
    assert [r.facts for r in reqs] == list(questions["facts"]) and all(json.loads(r.facts) for r in reqs)
    answers = {}
    teacher.run(reqs, lambda o: answers.update({o.key: o.text}))
    assert all(" Answer: " in answers[r.key] for r in reqs)
