"""Points24, the card game: its rules on hand-computed formulas, its actions, its seeded hands and random
actions, its images (one card per panel of image tokens), and the scripted solver."""
import itertools
from fractions import Fraction

import pytest

from protege.world.envs import ENVS, Points24Env, Points24Params, eval_seed, make_env, train_seed
from protege.world.envs.points24 import (ALL_TOKENS, EVAL_SEED_OFFSET, OUTLINE, PAPER, UNPARSED, action_start,
                                         draw_hand, evaluate, formula_steps, parse_action, render, solve_hand,
                                         tree_tokens)
from protege.world.envs.points24_solver import CARDS, all_texts, expert_episode, plan_tokens, solve

P = Points24Params()
EZ = Points24Params(cards=2)


def play(env, tokens):
    """Plays `tokens` as bare actions; the step results."""
    return [env.step(f"Action: {t}") for t in tokens]


# ------------------------------------------------------------------------------------------ rules


def test_a_correct_formula_pays_ten_and_ends():
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    results = play(env, ["(", "2", "+", "4", "-", "3", ")", "*", "8"])  # (2+4-3)*8 = 3*8 = 24
    assert all(r.reward == 0 and not r.done and r.info["legal"] for r in results)
    assert results[-1].observation.text.endswith("Formula so far: (2+4-3)*8.")
    end = env.step("It is 24. Action: =")
    assert (end.reward, end.done, end.info["success"], end.observation) == (10.0, True, True, None)
    assert env.success and env.turn == 10
    with pytest.raises(RuntimeError, match="over"):
        env.step("Action: =")


def test_a_wrong_value_or_an_unused_card_pays_minus_one():
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    *_, end = play(env, ["3", "*", "8", "+", "2", "-", "4", "="])  # 24 + 2 - 4 = 22
    assert (end.reward, end.done, end.info["success"]) == (-1.0, True, False)
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    *_, end = play(env, ["3", "*", "8", "="])  # 24, but 2 and 4 unused
    assert (end.reward, end.done, end.info["success"]) == (-1.0, True, False)
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    *_, end = play(env, ["(", "3", "*", "8", "="])  # unclosed bracket: not a formula
    assert (end.reward, end.done) == (-1.0, True)
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    assert play(env, ["="])[0].reward == -1.0  # nothing written


def test_a_reused_or_absent_card_is_illegal_and_ends():
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    first, op, again = play(env, ["3", "+", "3"])
    assert first.reward == op.reward == 0 and not op.done
    assert (again.reward, again.done, again.info["legal"], again.info["parsed"]) == (-1.0, True, False, True)
    assert again.info["illegal"] == "no unused card 3" and env.formula == ("3", "+")
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    assert play(env, ["10"])[0].info["illegal"] == "no unused card 10"
    twice = Points24Env.from_hand(P, (6, 6, 6, 6))  # a value held twice may be used twice
    *_, end = play(twice, ["6", "*", "6", "-", "6", "-", "6", "="])
    assert end.reward == 10.0


@pytest.mark.parametrize("prefix,token,why", [
    ([], "+", "+ must follow a number or )"),
    (["3"], "8", "a number must follow an operator or ("),
    (["3"], "(", "( must not follow a number or )"),
    (["(", "3", ")"], "8", "a number must follow an operator or ("),
    (["3"], ")", ") closes no ("),
    (["("], ")", ") must follow a number or )"),
    (["3", "*"], "-", "- must follow a number or )"),  # no unary minus
])
def test_a_syntactically_impossible_token_is_illegal_and_ends(prefix, token, why):
    env = Points24Env.from_hand(P, (3, 8, 2, 4))
    assert not any(r.done for r in play(env, prefix))
    res = env.step(f"Action: {token}")
    assert (res.reward, res.done, res.info["legal"], res.info["illegal"]) == (-1.0, True, False, why)


def test_division_by_zero_is_wrong():
    assert evaluate(["4", "/", "(", "2", "-", "2", ")"]) is None
    env = Points24Env.from_hand(P, (4, 2, 2, 5))
    *_, end = play(env, ["4", "/", "(", "2", "-", "2", ")", "*", "5", "="])
    assert (end.reward, end.done, end.info["success"]) == (-1.0, True, False)


def test_exact_fractions():
    # 8 / (3 - 8/3) = 8 / (1/3) = 24 exactly; floats give 23.999999999999993
    assert evaluate(list("8/(3-8/3)")) == 24
    assert evaluate(list("1/3")) == Fraction(1, 3) and evaluate(list("2+3*4")) == 14
    assert evaluate(list("8-4-2")) == 2 and evaluate(list("8/4/2")) == 1  # left to right
    assert evaluate(list("(2+3")) is None and evaluate(list("2+")) is None and evaluate([]) is None
    env = Points24Env.from_hand(P, (3, 3, 8, 8))
    *_, end = play(env, list("8/(3-8/3)="))
    assert end.reward == 10.0


def test_running_out_of_turns_pays_minus_one():
    env = Points24Env.from_hand(Points24Params(max_turns=12), (3, 8, 2, 4))
    results = play(env, ["("] * 12)
    assert [r.reward for r in results] == [0.0] * 11 + [-1.0] and results[-1].done
    assert results[-1].info["out_of_turns"] and results[-1].info["legal"]


def test_ezpoints_two_cards_plus_and_times_to_twelve():
    env = Points24Env.from_hand(EZ, (3, 4))
    *_, end = play(env, ["3", "*", "4", "="])
    assert end.reward == 10.0 and EZ.target == 12 and EZ.operators == ("+", "*")
    env = Points24Env.from_hand(EZ, (3, 4))
    assert env.step("Action: -").info["parsed"] is False  # not a token of this game: a random one is played
    assert "with + *." in env.observation().text


def test_rewards_are_configurable():
    params = Points24Params(correct_reward=1.0, wrong_reward=-0.25)
    env = Points24Env.from_hand(params, (3, 8, 2, 4))
    assert play(env, ["3", "*", "8", "="])[-1].reward == -0.25
    env = Points24Env.from_hand(params, (3, 8, 2, 4))
    assert play(env, list("(2+4-3)*8="))[-1].reward == 1.0


def test_params_are_checked():
    with pytest.raises(ValueError, match="cards must be 4"):
        Points24Params(cards=3)
    with pytest.raises(ValueError, match="max_turns must be >= 12"):
        Points24Params(max_turns=11)
    assert Points24Params(cards=2, max_turns=4).max_turns == 4
    with pytest.raises(ValueError, match="image_size"):
        Points24Params(image_size=66)
    with pytest.raises(ValueError, match="target"):
        Points24Params(target=0)
    assert Points24Params(target=10).target == 10 and P.target == 24


# ------------------------------------------------------------------------------------------ actions


def test_parse_action():
    assert parse_action("I see 3 and 8. Action: 8") == "8"
    assert parse_action("Action: 10.") == "10"
    assert parse_action("  action:(  ") == "("
    assert [parse_action(f"x Action: {t}") for t in ALL_TOKENS] == list(ALL_TOKENS)
    for bad in ["Action: 11", "Action: 0", "Action: 8 then", "Action: 3 Action: 4", "no action", "reaction: 3",
                "Action: x", "Action: **", "Action:"]:
        assert parse_action(bad) is None, bad
    assert parse_action("Action: -", EZ.tokens) is None and parse_action("Action: *", EZ.tokens) == "*"
    text = "The cards are 3, 8. Action: ="
    assert text[:action_start(text)] == "The cards are 3, 8. " and action_start("Action: up") is None
    assert ENVS["points24"].action_start is action_start


def test_random_action_on_garbage_is_seeded_by_episode_and_turn():
    def first_random(seed):
        env = Points24Env(P)
        env.reset(seed)
        res = env.step("no idea")
        return res.info["action"], res.info["parsed"], res.info["legal"]

    a = first_random(train_seed(3))
    assert a == first_random(train_seed(3)) and a[1] is False and a[2] is False  # a format error either way
    assert len({first_random(train_seed(s))[0] for s in range(40)}) > 5  # drawn, not fixed
    env = Points24Env(P)
    env.reset(train_seed(3))
    env.step("Action: (")  # legal: the next garbage turn draws with turn 1's generator
    second = env.step("???")
    again = Points24Env(P)
    again.reset(train_seed(3))
    again.step("Action: (")
    assert again.step("!!!").info["action"] == second.info["action"]
    assert second.observation is None or UNPARSED in second.observation.text


# ------------------------------------------------------------------------------------------ seeds and images


def test_hands_are_deterministic_solvable_and_split():
    assert [draw_hand(P, s) for s in range(30)] == [draw_hand(P, s) for s in range(30)]
    hands = [draw_hand(P, train_seed(i)) for i in range(300)]
    assert len(set(hands)) > 150 and all(1 <= v <= 10 for h in hands for v in h)
    assert all(solve_hand(h, 24, P.operators) is not None for h in hands)
    assert sum(h.count(10) for h in hands) > sum(h.count(5) for h in hands) * 2  # J, Q, K count 10
    assert eval_seed(0) == EVAL_SEED_OFFSET > train_seed(EVAL_SEED_OFFSET - 1)
    a, b = Points24Env(P), make_env("points24")
    oa, ob = a.reset(7), b.reset(7)
    assert a.hand == b.hand and oa.text == ob.text and oa.image.tobytes() == ob.image.tobytes()
    assert "nothing yet" in oa.text and all(str(v) not in oa.text.split("Formula")[0] for v in (5, 6, 7, 9))
    ez = {draw_hand(EZ, s) for s in range(100)}
    assert all(len(h) == 2 and (h[0] + h[1] == 12 or h[0] * h[1] == 12) for h in ez)


def test_each_card_is_drawn_in_its_own_panel_of_image_tokens():
    img = render((3, 8, 10, 1), 64)
    assert img.size == (64, 64) and img.mode == "RGB"
    panel = lambda im, i, w=16: im.crop((i * w, 0, (i + 1) * w, 64)).tobytes()  # noqa: E731
    # a panel's pixels depend on its own card only: the same card looks the same in any slot and any hand
    for hand in [(3, 8, 10, 1), (8, 3, 1, 10), (3, 3, 3, 3), (5, 8, 2, 10)]:
        other = render(hand, 64)
        for i, v in enumerate(hand):
            assert panel(other, i) == panel(render((v, 1, 1, 1), 64), 0)
    faces = {panel(render((v, 1, 1, 1), 64), 0) for v in range(1, 11)}
    assert len(faces) == 10  # every value looks different
    assert img.getpixel((0, 0)) == OUTLINE and img.getpixel((8, 4)) == PAPER
    assert render((3, 8, 10, 1), 64).tobytes() == img.tobytes()  # pure
    two = render((10, 7), 64)  # 2 cards: a 32 px panel each (2 x 4 image tokens)
    assert two.crop((32, 0, 64, 64)).tobytes() == render((3, 7), 64).crop((32, 0, 64, 64)).tobytes()
    env = Points24Env.from_hand(P, (3, 8, 10, 1))
    first = env.observation().image.tobytes()
    env.step("Action: 3")
    assert env.observation().image.tobytes() == first  # the cards only; the formula is in the text


# ------------------------------------------------------------------------------------------ the solver


def brute_force(hand, target=24):
    """Every order, operator and bracketing of four cards, evaluated exactly."""
    F = Fraction
    for a, b, c, d in set(itertools.permutations(hand)):
        for o1, o2, o3 in itertools.product("+-*/", repeat=3):
            for shape in ("((a o1 b) o2 c) o3 d", "(a o1 (b o2 c)) o3 d", "(a o1 b) o2 (c o3 d)",
                          "a o1 ((b o2 c) o3 d)", "a o1 (b o2 (c o3 d))"):
                expr = shape.replace("o1", o1).replace("o2", o2).replace("o3", o3)
                for name, v in zip("abcd", (a, b, c, d)):
                    expr = expr.replace(name, f"F({v})")
                try:
                    if eval(expr, {"F": F}) == target:
                        return True
                except ZeroDivisionError:
                    pass
    return False


def test_the_solver_finds_formulas_and_knows_unsolvable_hands():
    for hand, formula in [((3, 8, 2, 4), "(2+4-3)*8"), ((6, 6, 6, 6), "6*6-6-6"), ((3, 3, 8, 8), "8/(3-8/3)")]:
        assert "".join(tree_tokens(solve_hand(hand, 24, P.operators))) == formula
        assert evaluate(tree_tokens(solve_hand(hand, 24, P.operators))) == 24
    assert solve_hand((1, 1, 1, 1), 24, P.operators) is None and solve_hand((10, 10, 10, 10), 24, P.operators) is None
    assert "".join(tree_tokens(solve_hand((3, 4), 12, EZ.operators))) == "3*4"
    assert solve_hand((5, 5), 12, EZ.operators) is None
    # against an independent brute force on a spread of hands
    for hand in [(1, 2, 3, 4), (1, 1, 1, 1), (5, 5, 5, 1), (7, 7, 3, 3), (1, 6, 6, 8), (9, 9, 9, 9), (1, 1, 2, 7),
                 (4, 7, 8, 8), (2, 2, 2, 9), (10, 10, 4, 4), (1, 1, 1, 8), (3, 3, 7, 7)]:
        assert (solve_hand(hand, 24, P.operators) is not None) == brute_force(hand), hand
    assert formula_steps(list("(8-4)*6")) == ["8-4=4", "4*6=24"]
    assert formula_steps(list("8/(3-8/3)")) == ["8/3=8/3", "3-(8/3)=1/3", "8/(1/3)=24"]


@pytest.mark.parametrize("params", [P, EZ])
def test_solver_episodes_replay_to_ten(params):
    for seed in range(40):
        turns = expert_episode(params, train_seed(seed))
        env = Points24Env(params)
        obs = env.reset(train_seed(seed))
        assert obs.text == turns[0][0].text
        for k, (_, text) in enumerate(turns):
            res = env.step(text)
            assert res.info["parsed"] and res.info["legal"]
        assert res.reward == params.correct_reward and res.done and env.success
        assert len(turns) == len(plan_tokens(params, env.hand)) + 1 <= params.max_turns
        assert turns[-1][1].endswith("Action: =")


def test_solver_thoughts_name_the_cards_and_the_plan_in_varied_words():
    openings, texts = set(), set()
    for seed in range(30):
        turns = expert_episode(P, train_seed(seed))
        hand = draw_hand(P, train_seed(seed))
        plan = "".join(plan_tokens(P, hand))
        for _, text in turns:
            thought = text[:action_start(text)]
            digits = [d for d in thought.split(".")[0].replace(",", " ").replace("and", " ").split() if d.isdigit()]
            assert digits == [str(v) for v in hand]  # the cards, in the image's order
            assert plan in thought or ", " in thought  # the plan, whole or as its steps
            openings.add(thought.split(" ")[0])
            texts.add(thought)
    assert len(openings) >= len(CARDS) - 1 and len(texts) > 200
    assert [t for _, t in expert_episode(P, train_seed(4))] == [t for _, t in expert_episode(P, train_seed(4))]
    bad = Points24Env.from_hand(P, (3, 8, 2, 4))
    bad.step("Action: 4")  # the plan starts with (
    with pytest.raises(ValueError, match="not a start of the plan"):
        solve(bad)


def test_registry_wires_the_game():
    spec = ENVS["points24"]
    assert spec.env is Points24Env and spec.params is Points24Params and spec.expert_episode is expert_episode
    texts = all_texts(P)
    assert "Action: =" in texts and any("24" in t for t in texts)
    with pytest.raises(ValueError, match="unknown 'points24' env params"):
        make_env("points24", size=4)


def test_the_agent_recipes_pick_the_game_from_agent_env():
    """One place (the registry, through rollout.games) gives the configured game's env, params, turn limit,
    solver and action parser; the grid stays the default."""
    from protege.config import AgentConfig
    from protege.rollout.games import action_start_for, env_factory, expert_episodes, game_params, max_turns
    from protege.world.envs import GridEnv, GridParams
    from protege.world.envs import action_start as grid_action_start

    assert AgentConfig().env == "grid" and AgentConfig().points24.target is None
    grid = AgentConfig.model_validate({"grid": {"max_turns": 3}})
    assert isinstance(env_factory(grid, 64)(), GridEnv) and max_turns(grid) == 3
    assert game_params(grid, 64) == GridParams(max_turns=3, walls=4) and action_start_for(grid) is grid_action_start
    cfg = AgentConfig.model_validate({"env": "points24", "points24": {"cards": 2, "max_turns": 5}})
    assert game_params(cfg, 64) == Points24Params(cards=2, max_turns=5, image_size=64)
    env = env_factory(cfg, 64)()
    assert isinstance(env, Points24Env) and env.params.target == 12 and max_turns(cfg) == 5
    assert action_start_for(cfg) is action_start
    episodes = expert_episodes(cfg, 64, 3)
    assert [t for _, t in episodes[1]] == [t for _, t in expert_episode(game_params(cfg, 64), train_seed(1))]
    with pytest.raises(ValueError, match="max_turns must be at least 12"):
        AgentConfig.model_validate({"env": "points24", "points24": {"max_turns": 11}})
