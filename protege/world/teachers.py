"""Two scripted teachers with distinct verbal styles and strengths, standing in for large VLMs behind an API,
and the weaker source the world's SFT targets come from.

They see the ground truth (they are scripted) and answer wrongly at a rate that depends on the
question kind: `error_rate` on the kinds they are strong at, `WEAK_FACTOR` times that on the others.
`concise` is strong at counting and charts, `verbose` at colours, shapes and comparisons, so the two
teachers together know more than either alone.

With accounts (`world.accounts`, the default) a teacher first gives a short grounded account of the image
(what it sees that the question is about, and how that gives the answer), then its final answer after
"Answer:", which is all the judge reads: "I see 3 red circles. Answer: 3.". A wrong answer comes with an
account that leads to it (miscounted shapes, the wrong bar height, the other image counted higher), so a
teacher's account and answer are right or wrong together; the facts it does not rest its answer on are
always right. The two styles differ in wording ("3 red circles." against "There are 3 red circles.") and in
how they end: `concise` says the bare answer, `verbose` ends it with a full stop.

The SFT targets (`sft_target`) come from a weaker source in the same format and the same styles, half each:
its final answer is the reference, but its account is wrong more often than a teacher's. At the rate
`world.sft_account_vague` it has not noticed what its answer rests on and leaves it vague ("Some red circles.
Answer: 3", "Green bar at some height."); at the rate `world.sft_account_error` it misreports one of the facts
it states (a count, a colour, a shape, a bar, an option letter), so that its account contradicts the image or
its own answer. The SFT student so speaks like the teachers and differs from them in content, as RIL's 7B
student differs from its 72B teachers in what it notices and how it reasons, not in punctuation. Measured on
a small world (dev/LOG.md), the tiny discriminator learns the vague accounts (held-out AUROC about 0.7) but not
the misreported ones (about 0.5 with misreports alone): a wrong fact is told apart only by relating it to the
image or to the answer, which it does not learn in its pretraining.

Without accounts, or for a question without recorded facts (your own data), a teacher says the answer alone.
Each answer is a pure function of (teacher, question id, sample index, seed), so a cache is exact.
"""
from __future__ import annotations

import copy
import hashlib
import random

from protege.world.scenes import BAR_COLOURS, COLOURS, MAX_BAR, MAX_COUNT, SHAPES

CONCISE = ["{a}"]  # the bare answer
VERBOSE = ["{a}."]
STYLES = ("concise", "verbose")
STRONG = {"concise": {"count", "count_option", "chart_value", "chart_option"},
          "verbose": {"colour", "shape", "shape_option", "yes_no", "compare_two"}}
WEAK_FACTOR = 3.0
LETTERS = "ABCD"
MARK = "Answer:"  # what the final answer follows; the judge reads only the sentence after it

# an account's wording, per style: {n} a count, {c} a colour, {s} a shape (plural unless {n} is 1), {be} "is"
# or "are" for {n}, {bar} a bar's colour, {v} its value, {a} / {b} the two images' counts, {sh} "shape(s)" for
# {a}. The longest account with its final answer is 14 tokens of the world's tokenizer (15 with the end of
# turn), inside the 16 new tokens the rollouts, the RL loop and the evaluation give by default
SCENE = {"concise": ["{n} {c} {s}.", "{n} {c} {s} here."],
         "verbose": ["I see {n} {c} {s}.", "There {be} {n} {c} {s}.", "It shows {n} {c} {s}."]}
BAR = {"concise": ["{bar} bar at {v}.", "{bar} bar: {v}."],
       "verbose": ["The {bar} bar reaches {v}.", "The {bar} bar is {v}."]}
PAIR = {"concise": ["{a} {sh}, then {b}.", "{a} {sh} against {b}."],
        "verbose": ["I count {a} {sh}, then {b}.", "I see {a} {sh}, then {b}."]}
OPTION = {"concise": ["{fact} Option {L}."], "verbose": ["{fact} Option {L}."]}
# what an account says in place of a fact its speaker did not notice
VAGUE = {"count": "some", "colour": "coloured", "shape": "shape", "value": "some height"}
SCENE_KINDS = ("count", "colour", "shape", "shape_option", "count_option", "yes_no")
CHART_KINDS = ("chart_value", "chart_option")
OPTION_KINDS = ("shape_option", "count_option", "chart_option")


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def kind_error_rate(teacher: str, kind: str, error_rate: float) -> float:
    """How often `teacher` answers a `kind` question wrongly."""
    return error_rate if kind in STRONG[teacher] else min(1.0, WEAK_FACTOR * error_rate)


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; expected one of {STYLES}")


def styled(style: str, answer: str) -> str:
    """`answer` in a style's phrasing (its first template): the bare final answer."""
    _check_style(style)
    return (CONCISE if style == "concise" else VERBOSE)[0].format(a=answer)


def has_account(kind: str, facts: dict | None) -> bool:
    """Whether an account can be given for a question of `kind` with these recorded facts."""
    if not facts:
        return False
    if kind in SCENE_KINDS:
        return "scene" in facts and (kind not in OPTION_KINDS or "options" in facts) and \
            (kind != "yes_no" or "asked" in facts)
    if kind in CHART_KINDS:
        return "bars" in facts and "bar" in facts and (kind not in OPTION_KINDS or "options" in facts)
    return kind == "compare_two" and len(facts.get("scenes", ())) == 2


def _other(rng: random.Random, values, current):
    return rng.choice([v for v in values if v != current])


def reported_facts(kind: str, facts: dict, said: str, answer: str, rng: random.Random) -> dict:
    """The facts as a speaker who answers `said` to a question whose answer is `answer` reports them: the
    ground truth when `said` is right, else changed just enough to lead to `said`."""
    out = copy.deepcopy(facts)
    if said == answer:
        return out
    option = facts["options"][LETTERS.index(said)] if kind in OPTION_KINDS else None
    if kind in ("count", "count_option"):
        out["scene"]["count"] = int(said if kind == "count" else option)
    elif kind == "colour":
        out["scene"]["colour"] = said
    elif kind in ("shape", "shape_option"):
        out["scene"]["shape"] = said if kind == "shape" else option
    elif kind in CHART_KINDS:
        out["bars"][facts["bar"]] = int(said if kind == "chart_value" else option)
    elif kind == "yes_no":
        asked = facts["asked"]
        if said == "Yes":    # sees exactly what the question asks about
            out["scene"].update(asked)
        else:                # sees something else in one of the asked respects
            key = rng.choice(sorted(asked))
            out["scene"][key] = _other(rng, COLOURS if key == "colour" else SHAPES, asked[key])
    elif kind == "compare_two":  # counts the other image as the fuller one
        out["scenes"] = [out["scenes"][1], out["scenes"][0]]
    return out


def stated_facts(kind: str) -> list[tuple]:
    """The facts an account of `kind` states, as paths into the facts dict ("option" is the letter it links
    the seen value to)."""
    if kind in SCENE_KINDS:
        out = [("scene", "count"), ("scene", "colour"), ("scene", "shape")]
    elif kind in CHART_KINDS:
        out = [("bar",), ("value",)]
    else:
        out = [("scenes", 0, "count"), ("scenes", 1, "count")]
    return out + [("option",)] * (kind in OPTION_KINDS)


def misreport(kind: str, facts: dict, letter: str, rng: random.Random) -> tuple[dict, str]:
    """`facts` and the option `letter` an account names with one stated fact, drawn at random, replaced by
    another value."""
    out = copy.deepcopy(facts)
    path = rng.choice(stated_facts(kind))
    if path == ("option",):
        return out, _other(rng, LETTERS, letter)
    if path == ("bar",):  # reads another bar's name for the asked bar's height
        value = out["bars"].pop(out["bar"])
        out["bar"] = _other(rng, BAR_COLOURS, facts["bar"])
        out["bars"][out["bar"]] = value
    elif path == ("value",):
        out["bars"][out["bar"]] = _other(rng, range(1, MAX_BAR + 1), facts["bars"][facts["bar"]])
    else:
        *where, key = path
        holder = out
        for p in where:
            holder = holder[p]
        values = {"count": range(1, MAX_COUNT + 1), "colour": COLOURS, "shape": SHAPES}[key]
        holder[key] = _other(rng, values, holder[key])
    return out, letter


def unnoticed(kind: str, facts: dict) -> dict:
    """`facts` with what the answer to a `kind` question rests on left vague ("some red circles" for a count,
    "3 coloured circles" for a colour, "some height" for a bar, "some shapes, then some" for two images)."""
    out = copy.deepcopy(facts)
    if kind in ("count", "count_option"):
        out["scene"]["count"] = VAGUE["count"]
    elif kind in ("colour", "shape", "shape_option"):
        key = "colour" if kind == "colour" else "shape"
        out["scene"][key] = VAGUE[key]
    elif kind == "yes_no":
        for key in facts["asked"]:
            out["scene"][key] = VAGUE[key]
    elif kind in CHART_KINDS:
        out["bars"][out["bar"]] = VAGUE["value"]
    else:
        for scene in out["scenes"]:
            scene["count"] = VAGUE["count"]
    return out


def _scene_words(scene: dict) -> dict:
    one = scene["count"] == 1
    return {"n": scene["count"], "c": scene["colour"], "s": scene["shape"] + ("" if one else "s"),
            "be": "is" if one else "are"}


def account(style: str, kind: str, facts: dict, letter: str, rng: random.Random) -> str:
    """One account of what `facts` show, in `style`'s wording (drawn with `rng`); an option question's account
    ends by naming the option `letter` the seen value is."""
    _check_style(style)
    if kind in SCENE_KINDS:
        text = rng.choice(SCENE[style]).format(**_scene_words(facts["scene"]))
    elif kind in CHART_KINDS:
        text = rng.choice(BAR[style]).format(bar=facts["bar"], v=facts["bars"][facts["bar"]])
    else:
        first, second = (f["count"] for f in facts["scenes"])
        text = rng.choice(PAIR[style]).format(a=first, b=second, sh="shape" if first == 1 else "shapes")
    if kind in OPTION_KINDS:
        text = rng.choice(OPTION[style]).format(fact=text, L=letter)
    return _capital(text)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def with_account(style: str, text: str, said: str) -> str:
    """An account followed by the marked final answer, in `style`."""
    return f"{text} {MARK} {styled(style, said)}"


def scripted_answer(teacher: str, kind: str, answer: str, candidates: list[str], item_id: str,
                    sample_index: int, error_rate: float, seed: int, facts: dict | None = None) -> str:
    """One answer of a scripted teacher: an account and the final answer when `facts` allow an account, else
    the answer alone; wrong (account and answer together) at the teacher's rate for the kind."""
    if teacher not in STYLES:
        raise ValueError(f"unknown scripted teacher {teacher!r}; expected one of {STYLES}")
    rng = _rng(teacher, item_id, sample_index, seed)
    said = answer
    wrong = [c for c in candidates if c != answer]
    if wrong and rng.random() < kind_error_rate(teacher, kind, error_rate):
        said = rng.choice(wrong)
    if not has_account(kind, facts):
        return rng.choice(CONCISE if teacher == "concise" else VERBOSE).format(a=said)
    seen = reported_facts(kind, facts, said, answer, rng)
    return with_account(teacher, account(teacher, kind, seen, said, rng), said)


def sft_target(style: str, kind: str, answer: str, facts: dict | None, item_id: str, account_error: float,
               seed: int, account_vague: float = 0.0) -> str:
    """The weaker source's SFT target in `style`: an account that leaves what the answer rests on vague with
    probability `account_vague`, else misreports one stated fact with probability `account_error`, then the
    reference answer; the answer alone when `facts` allow no account."""
    _check_style(style)
    if not has_account(kind, facts):
        return styled(style, answer)
    rng = _rng("sft", item_id, seed)
    seen, letter = facts, answer
    draw = rng.random()
    if draw < account_vague:
        seen = unnoticed(kind, facts)
    elif draw < account_vague + account_error:
        seen, letter = misreport(kind, facts, answer, rng)
    return with_account(style, account(style, kind, seen, letter, rng), answer)


def behaviour_digest(teacher: str, error_rate: float, seed: int, accounts: bool = False) -> str:
    """Identifies everything that decides a scripted teacher's answers (its phrasings, strengths, error
    rates, seed, whether it gives accounts): the teacher cache keys on it, so changing any of them asks the
    teacher again."""
    what = [teacher, CONCISE, VERBOSE, sorted(STRONG.get(teacher, ())), WEAK_FACTOR, error_rate, seed]
    if accounts:
        what += [MARK, SCENE, BAR, PAIR, OPTION, "accounts-v1"]  # VAGUE is the SFT source's only
    return hashlib.sha256(repr(what).encode()).hexdigest()[:12]


def all_templates() -> list[str]:
    """Every phrase a teacher or the SFT source can say (for training the tokenizer on the world's text): the
    bare answers' phrasings, and every account wording with every value it can hold."""
    out = CONCISE + VERBOSE
    for style in STYLES:
        for n in [*range(1, MAX_COUNT + 1), VAGUE["count"]]:
            for c in [*COLOURS, VAGUE["colour"]]:
                for s in [*SHAPES, VAGUE["shape"]]:
                    out += [_capital(t.format(**_scene_words({"count": n, "colour": c, "shape": s})))
                            for t in SCENE[style]]
        out += [_capital(t.format(bar=bar, v=v)) for t in BAR[style] for bar in BAR_COLOURS
                for v in [*range(1, MAX_BAR + 1), VAGUE["value"]]]
        out += [_capital(t.format(a=a, b=b, sh="shape" if a == 1 else "shapes")) for t in PAIR[style]
                for a in [*range(1, MAX_COUNT + 1), VAGUE["count"]] for b in [*range(1, MAX_COUNT + 1), VAGUE["count"]]]
        out += [t.format(fact="", L=L).strip() for t in OPTION[style] for L in LETTERS]
        out += [f"{MARK} {styled(style, a)}" for a in ("Yes", "No", *LETTERS)]
    return out
