import re

import pytest

from PIL import Image, ImageDraw

from protege.tools.sandbox import Limits, Outcome, Sandbox, SandboxUnavailable
from protege.world.envs.grid import EVAL_SEED_OFFSET
from protege.world.envs.tool import (INSTRUCTION, KINDS, ToolEnv, ToolParams, draw_digit, draw_question,
                                     eval_seed, extract_boxed, extract_code, parse_int, render_question,
                                     train_seed)
from protege.world.envs.tool_solver import expert_episode, solve_turns


@pytest.fixture(scope="module")
def sandbox():
    try:
        return Sandbox()
    except SandboxUnavailable as exc:
        pytest.skip(f"the real sandbox cannot run here (tool turns need it): {exc}")


def fake(stdout="", exit_code=0, limit=None, ms=1.0):
    """A sandbox that answers every run with one fixed Outcome: only for paths the real one cannot take."""
    class Fixed:
        def run(self, code):
            return Outcome(stdout, "", exit_code, limit, ms, "fake")
    return Fixed()


# penalties unlike the defaults and unlike each other, so that a test sees which one was given
PENALTIES = dict(format_penalty=-0.5, no_tool_penalty=-0.3, tool_error_penalty=-0.2)
P = ToolParams(**PENALTIES)
WHITE = (255, 255, 255)
# standard seven-segment digits, written out here independently of the env's table
SEVEN = {"abcdef": 0, "bc": 1, "abdeg": 2, "abcdg": 3, "bcfg": 4, "acdfg": 5, "acdefg": 6, "abc": 7,
         "abcdefg": 8, "abcdfg": 9}
PROBES = {"a": (0.5, 0.1), "b": (0.75, 0.3), "c": (0.75, 0.7), "d": (0.5, 0.85), "e": (0.25, 0.7),
          "f": (0.25, 0.3), "g": (0.5, 0.5)}


def seed_of(kind, params=P, start=0):
    return next(s for s in range(start, start + 1000) if draw_question(params, s).kind == kind)


def read_digit(img, row, col, cell):
    lit = "".join(s for s, (fx, fy) in PROBES.items()
                  if img.getpixel((col * cell + int(fx * cell), row * cell + int(fy * cell))) != WHITE)
    return SEVEN.get(lit)


def read_number(img, row, cell):
    digits = [read_digit(img, row, c, cell) for c in range(2)]
    assert None not in digits
    return digits[0] * 10 + digits[1]


def apply(word, a, b):
    return {"Add": a + b, "plus": a + b, "Subtract": a - b, "minus": a - b, "Multiply": a * b,
            "times": a * b}[word]


def test_reset_is_deterministic_and_seeds_differ():
    a, b = ToolEnv(P), ToolEnv(P)
    for seed in (0, 7, eval_seed(3)):
        oa, ob = a.reset(seed), b.reset(seed)
        assert oa.image.tobytes() == ob.image.tobytes() and oa.text == ob.text
        assert (a.answer, a.kind, a.question) == (b.answer, b.kind, b.question)
        assert oa.text == f"{a.question} {INSTRUCTION}" and oa.role == "user"
    train = {(q.kind, q.text, q.answer, render_question(q, 64).tobytes())
             for q in (draw_question(P, train_seed(i)) for i in range(60))}
    evals = {(q.kind, q.text, q.answer, render_question(q, 64).tobytes())
             for q in (draw_question(P, eval_seed(i)) for i in range(60))}
    assert len(train) > 55 and len(evals) > 55 and len(train & evals) < 3
    assert eval_seed(0) == EVAL_SEED_OFFSET == 10**6 and train_seed(5) == 5
    assert {draw_question(P, s).kind for s in range(60)} == set(KINDS)
    only = ToolParams(kinds=("count",))
    assert {draw_question(only, s).kind for s in range(30)} == {"count"}


def test_seven_segment_digits_are_distinct_and_decode():
    qs = [draw_question(ToolParams(kinds=("arithmetic",)), s) for s in range(200)]
    glyphs = {}
    for d in range(10):
        img = Image.new("RGB", (16, 16), WHITE)
        draw_digit(ImageDraw.Draw(img), d, 0, 0, 16)
        glyphs[d] = img.tobytes()
        assert read_digit(img, 0, 0, 16) == d
    assert len(set(glyphs.values())) == 10
    for size in (64, 128):
        for q in qs[:40]:
            img = render_question(q, size)
            cell = size // 4
            assert (read_number(img, 0, cell), read_number(img, 2, cell)) == q.numbers
    for q in qs:
        img = render_question(q, 64)
        top, bottom = read_number(img, 0, 16), read_number(img, 2, 16)
        assert 10 <= top <= 99 and 10 <= bottom <= 99
        word = q.text.split()[0]
        assert q.answer == apply(word, top, bottom)
        # each digit stays inside its own 16x16 cell: rows 1 and 3 and columns 2-3 are blank
        blank = [(x, y) for x in range(64) for y in range(64) if y // 16 in (1, 3) or x // 16 >= 2]
        assert all(img.getpixel(p) == WHITE for p in blank[::7])
    assert {q.op for q in qs} == {"sum", "difference", "product"}


def test_chart_answer_matches_the_drawn_bars():
    from protege.world.scenes import COLOURS
    names = {v: k for k, v in COLOURS.items()}
    params = ToolParams(kinds=("chart",))
    texts = set()
    for s in range(150):
        q = draw_question(params, s)
        img = render_question(q, 64)
        drawn = {}
        for col in range(4):
            x = col * 16 + 8
            column = [img.getpixel((x, y)) for y in range(64)]
            colour = column[59]
            assert colour in names and sum(c == colour for c in column) % 9 == 0
            drawn[names[colour]] = sum(c == colour for c in column) // 9  # 9 px per unit at 64 px
        assert drawn == q.bars and list(drawn) == list(q.bars)
        assert all(1 <= v <= 6 for v in drawn.values())
        m = re.fullmatch(r"What is the (\w+) bar's value (plus|minus|times) the (\w+) bar's value\?", q.text)
        if m:
            assert q.answer == apply(m.group(2), drawn[m.group(1)], drawn[m.group(3)])
        else:
            vals = list(drawn.values())
            expected = {"sum": sum(vals), "product": vals[0] * vals[1] * vals[2] * vals[3]}
            word = re.fullmatch(r"What is the (sum|product) of all the bars' values\?", q.text).group(1)
            assert q.answer == expected[word]
        texts.add(q.text.split()[3] if m else "all")
    assert len(texts) > 4  # several colours named and whole-chart questions drawn


def test_count_answer_matches_the_drawn_shapes():
    params = ToolParams(kinds=("count",))
    for s in range(100):
        q = draw_question(params, s)
        img = render_question(q, 64)
        assert img.size == (64, 64) and img.mode == "RGB"
        filled = sum(any(img.getpixel((c * 16 + x, r * 16 + y)) != WHITE for x in range(16) for y in range(16))
                     for r in range(4) for c in range(4))
        factor = int(re.fullmatch(r"How many shapes are in the image, multiplied by (\d+)\?", q.text).group(1))
        assert filled == q.scene.count and 11 <= factor <= 99
        assert q.answer == filled * factor


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_renders(kind):
    for size in (64, 96):
        env = ToolEnv(ToolParams(image_size=size, kinds=(kind,)))
        obs = env.reset(train_seed(1))
        assert obs.image.size == (size, size) and obs.image.mode == "RGB" and env.kind == kind
        assert obs.image.getcolors(256) is None or len(obs.image.getcolors(256)) > 1  # something drawn
        assert isinstance(env.answer, int)


@pytest.mark.parametrize("text,code", [
    ("Let me.\n```python\nprint(47 * 38)\n```", "print(47 * 38)"),
    ("```\nx = 2\nprint(x)\n```", "x = 2\nprint(x)"),
    ("```py\nprint(1)\n```", "print(1)"),
    ("``` python\nprint(1)```", "print(1)"),
    ("a ```python\nprint(1)\n``` b ```python\nprint(2)\n```", "print(1)"),  # the first block
    ("```bash\nls\n```\n```python\nprint(3)\n```", "print(3)"),  # other languages are skipped
    ("```python\nprint(1)\n", None),  # unclosed
    ("```python print(1)```", None),  # no newline after the tag: not a block
    ("print(1)", None),
    ("", None),
])
def test_extract_code(text, code):
    assert extract_code(text) == code


@pytest.mark.parametrize("text,boxed,value", [
    ("\\boxed{1786}", "1786", 1786),
    ("The answer is \\boxed{ 1786 }.", "1786", 1786),
    ("\\boxed{-12}", "-12", -12),
    ("\\boxed{+ 12}", "+ 12", 12),
    ("\\boxed{1,786}", "1,786", 1786),
    ("\\boxed{1786.0}", "1786.0", 1786),
    ("\\boxed{3} no, \\boxed{4}", "4", 4),  # the last one counts
    ("\\boxed{1,78}", "1,78", None),
    ("\\boxed{17.5}", "17.5", None),
    ("\\boxed{{5}}", "{5}", None),
    ("\\boxed{abc}", "abc", None),
    ("\\boxed{12", None, None),
    ("12", None, None),
])
def test_extract_boxed_and_parse_int(text, boxed, value):
    assert extract_boxed(text) == boxed
    assert parse_int(boxed) == value


def fixed_env(sandbox, kind="arithmetic", **kw):
    params = ToolParams(kinds=(kind,), **{**PENALTIES, **kw})
    env = ToolEnv(params, sandbox)
    env.reset(seed_of(kind, params))
    return env


def test_rewards_of_a_tool_episode(sandbox):
    env = fixed_env(sandbox)
    a, b = env.state.numbers
    r = env.step(f"The numbers are {a} and {b}.\n```python\nprint({a} + {b})\n```\n\\boxed{{0}}")
    assert r.reward == 0.0 and not r.done and r.observation.role == "tool" and r.observation.image is None
    assert r.observation.text.strip() == str(a + b)  # the code ran; the boxed text was ignored
    assert r.info == {"turn": 1, "tool_call": True, "runtime_error": False, "code": f"print({a} + {b})",
                      "legal": True, "parsed": True, "answer": None, "success": False,
                      "kind": "arithmetic", "limit": None, "tool_ms": r.info["tool_ms"]}
    assert r.info["tool_ms"] > 0 and env.observation() is r.observation
    r = env.step(f"So \\boxed{{{env.answer}}}")
    assert r.reward == 1.0 and r.done and r.observation is None
    assert r.info["success"] and r.info["parsed"] and r.info["legal"] and r.info["answer"] == str(env.answer)
    assert not r.info["tool_call"] and r.info["code"] == "" and r.info["turn"] == 2 and env.success
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("\\boxed{1}")


def test_wrong_unparsed_and_format_errors(sandbox):
    env = fixed_env(sandbox, "chart")
    r = env.step(f"\\boxed{{{env.answer + 1}}}")  # wrong, and no tool call before it
    assert r.reward == P.no_tool_penalty and r.done and r.info["parsed"] and r.info["legal"] and not r.info["success"]
    env.reset(1)
    r = env.step("\\boxed{many}")
    assert r.reward == P.no_tool_penalty and r.done and not r.info["parsed"] and r.info["legal"] and r.info["answer"] == "many"
    for text in ("I think it is 12.", "```python\nprint(1)", "", "boxed{12}"):
        env.reset(2)
        r = env.step(text)
        assert r.reward == P.format_penalty and r.done and r.observation is None
        assert not r.info["legal"] and not r.info["parsed"] and not r.info["tool_call"] and not env.success


def test_runtime_error_and_tool_budget(sandbox):
    env = fixed_env(sandbox, "count")
    r = env.step("```python\nprint(1/0)\n```")
    assert r.reward == P.tool_error_penalty and not r.done
    assert r.info["runtime_error"] and r.info["tool_call"] and r.info["legal"]
    assert r.observation.role == "tool" and r.observation.text.startswith("Error")
    assert "ZeroDivisionError" in r.observation.text and r.info["limit"] is None
    r = env.step("```python\nprint(6 * 7)\n```")
    assert r.reward == 0.0 and not r.done and r.observation.text.strip() == "42" and env.tool_calls == 2
    r = env.step("```python\nprint(6 * 8)\n```")  # the budget is spent
    assert r.reward == P.format_penalty and r.done and r.observation is None
    assert not r.info["legal"] and not r.info["tool_call"] and r.info["code"] == "print(6 * 8)"
    env = fixed_env(sandbox, "count", max_tool_calls=0)
    r = env.step("```python\nprint(1)\n```")
    assert r.reward == P.format_penalty and r.done and not r.info["legal"]
    env.reset(3)
    assert env.step(f"\\boxed{{{env.answer}}}").reward == 1.0  # no tool to call: no penalty for not calling it
    env = fixed_env(sandbox, "count")
    assert env.step(f"\\boxed{{{env.answer}}}").reward == 1.0 + P.no_tool_penalty  # right, but without the tool


def test_tool_output_is_cut(sandbox):
    env = fixed_env(sandbox, tool_output_chars=20)
    r = env.step("```python\nprint('x' * 500)\n```")
    assert not r.info["runtime_error"] and 0 < len(r.observation.text) <= 20


def test_limit_reaches_info():
    try:
        quick = Sandbox(Limits(timeout_s=0.5, cpu_s=2))
    except SandboxUnavailable as exc:
        pytest.skip(f"the real sandbox cannot run here: {exc}")
    env = fixed_env(quick)
    r = env.step("```python\nwhile True: pass\n```")
    assert r.reward == P.tool_error_penalty and not r.done and r.info["limit"] == "timeout"
    assert r.info["runtime_error"] and r.info["tool_ms"] >= 500 and r.observation.text.startswith("Error")


@pytest.mark.parametrize("kind", KINDS)
def test_expert_episodes_succeed(kind, sandbox):
    params = ToolParams(kinds=(kind,))
    for i in range(50):
        seed = train_seed(i) if i % 2 else eval_seed(i)
        env = ToolEnv(params, sandbox)
        env.reset(seed)
        turns = solve_turns(env)
        assert len(turns) == 2 and env.success
        (obs0, out0), (obs1, out1) = turns
        assert obs0.image is not None and obs0.role == "user" and obs1.role == "tool" and obs1.image is None
        assert extract_code(out0) and extract_boxed(out1) == str(env.answer) == obs1.text.strip()
    # the rewards of a replayed expert episode sum to a correct answer's reward
    env = ToolEnv(params, sandbox)
    env.reset(seed)
    total = sum(env.step(text).reward for _, text in turns)
    assert total == params.correct_reward and env.success


def test_expert_texts(sandbox):
    env = fixed_env(sandbox)
    a, b = env.state.numbers
    sign = {"sum": "+", "difference": "-", "product": "*"}[env.state.op]
    turns = expert_episode(env.params, env.seed, sandbox)
    assert turns[0][1] == f"The numbers are {a} and {b}.\n```python\nprint({a} {sign} {b})\n```"
    assert turns[1][1] == f"The answer is \\boxed{{{env.answer}}}."
    count = fixed_env(sandbox, "count")
    assert expert_episode(count.params, count.seed, sandbox)[0][1].startswith(
        "There is 1 shape." if count.state.scene.count == 1 else f"There are {count.state.scene.count} shapes.")
    no_tool = expert_episode(ToolParams(max_tool_calls=0), 4, sandbox)
    assert len(no_tool) == 1 and extract_code(no_tool[0][1]) is None


def test_slip_episodes_fail_then_fix_the_import(sandbox):
    for kind in ("count", "arithmetic"):
        params = ToolParams(kinds=(kind,), **PENALTIES)
        seed = next(s for s in range(1000) if draw_question(params, s).op == "product")
        turns = expert_episode(params, seed, sandbox, slip=True)
        env = ToolEnv(params, sandbox)
        env.reset(seed)
        values = ", ".join(str(v) for v in env.state.operands)
        assert len(turns) == 3, kind
        assert extract_code(turns[0][1]) == f"print(math.prod([{values}]))"
        assert turns[1][0].role == "tool" and "NameError" in turns[1][0].text
        assert extract_code(turns[1][1]) == f"import math\nprint(math.prod([{values}]))"
        assert extract_boxed(turns[2][1]) == str(env.answer) == turns[2][0].text.strip()
        # replayed, the slip costs exactly one tool-error penalty
        total = sum(env.step(text).reward for _, text in turns)
        assert total == pytest.approx(params.correct_reward + params.tool_error_penalty) and env.success
    # a slip only happens on product questions, and only with a second tool call to fix it in
    params = ToolParams(kinds=("arithmetic",))
    other = next(s for s in range(1000) if draw_question(params, s).op != "product")
    assert expert_episode(params, other, sandbox, slip=True) == expert_episode(params, other, sandbox)
    one_call = ToolParams(kinds=("count",), max_tool_calls=1)
    assert len(expert_episode(one_call, 3, sandbox, slip=True)) == 2


def test_solver_slips_share_is_per_seed(sandbox):
    from protege.config import ToolConfig
    from protege.rollout import games

    def slipped(share, n):
        cfg = ToolConfig(task={"kinds": ["count"]}, solver_slips=share)
        return [len(turns) == 3 for turns in games.expert_episodes(cfg, 64, n)]

    assert not any(slipped(0.0, 12)) and all(slipped(1.0, 12))
    half = slipped(0.5, 40)
    assert 8 <= sum(half) <= 32
    assert slipped(0.5, 12) == half[:12]  # an episode's slip does not depend on how many are drawn


def test_solver_raises_when_the_sandbox_lies():
    params = ToolParams(kinds=("arithmetic",))
    with pytest.raises(RuntimeError, match="solver failed"):
        expert_episode(params, seed_of("arithmetic", params), fake("0\n"))
    with pytest.raises(RuntimeError, match="not an integer"):
        expert_episode(params, 0, fake("", exit_code=1))


@pytest.mark.parametrize("kwargs,field", [
    ({"image_size": 62}, "image_size"),
    ({"image_size": 16}, "image_size"),
    ({"image_size": 64.0}, "image_size"),
    ({"max_tool_calls": -1}, "max_tool_calls"),
    ({"tool_output_chars": 0}, "tool_output_chars"),
    ({"kinds": ()}, "kinds"),
    ({"kinds": "chart"}, "kinds"),
    ({"kinds": ("chart", "maze")}, "kinds"),
    ({"kinds": ("chart", "chart")}, "kinds"),
    ({"correct_reward": float("nan")}, "correct_reward"),
    ({"format_penalty": "bad"}, "format_penalty"),
    ({"tool_error_penalty": True}, "tool_error_penalty"),
    ({"no_tool_penalty": float("inf")}, "no_tool_penalty"),
])
def test_bad_params(kwargs, field):
    with pytest.raises(ValueError, match=f"ToolParams.{field}"):
        ToolParams(**kwargs)


def test_default_sandbox_is_the_real_one(sandbox):
    env = ToolEnv(P)  # builds protege.tools.sandbox.Sandbox() at its first code run
    env.reset(0)
    r = env.step("```python\nprint(2 ** 10)\n```")
    assert isinstance(env.sandbox, Sandbox) and r.observation.text.strip() == "1024"


def test_params_and_env_misc():
    assert ToolParams(kinds=["chart", "count"]).kinds == ("chart", "count")  # lists become hashable tuples
    hash(ToolParams())
    with pytest.raises(RuntimeError, match="reset"):
        ToolEnv(P).step("\\boxed{1}")
    with pytest.raises(ValueError, match="params"):
        ToolEnv({"image_size": 64})
    with pytest.raises(ValueError, match="seed"):
        ToolEnv(P).reset("3")
