import pytest

from protege.world.envs import (GridEnv, GridParams, GridState, action_start, bfs_distance, draw_layout,
                                eval_seed, expert_episode, make_env, parse_action, render, solve,
                                train_seed)
from protege.world.envs.grid import (AGENT_COLOUR, EMPTY_COLOUR, EVAL_SEED_OFFSET, GOAL_COLOUR,
                                     INSTRUCTION, LINE_COLOUR, WALL_COLOUR)

P = GridParams()


def centre(cell, cell_px=16):
    return cell[1] * cell_px + cell_px // 2, cell[0] * cell_px + cell_px // 2


def test_reset_is_deterministic_and_envs_independent():
    a, b = GridEnv(), GridEnv()
    oa, ob = a.reset(7), b.reset(7)
    assert (a.agent, a.goal, a.walls) == (b.agent, b.goal, b.walls)
    assert oa.image.tobytes() == ob.image.tobytes() and oa.text == ob.text == INSTRUCTION
    a.step(solve(a.state))  # playing one env leaves the other alone
    assert b.turn == 0 and b.agent == draw_layout(P, 7).agent
    a.reset(7)
    assert (a.agent, a.turn, a.done) == (b.agent, 0, False)
    layouts = {(draw_layout(P, s).agent, draw_layout(P, s).goal, draw_layout(P, s).walls) for s in range(50)}
    assert len(layouts) > 40  # seeds give different layouts


def test_layouts_are_valid_and_solvable():
    for seed in range(300):
        s = draw_layout(P, seed)
        assert s.agent != s.goal and len(s.walls) == P.walls
        assert s.agent not in s.walls and s.goal not in s.walls
        assert all(s.inside(c) for c in [s.agent, s.goal, *s.walls])
        assert 1 <= bfs_distance(s) <= P.max_turns
    tight = GridParams(size=5, walls=20, max_turns=2, image_size=80)  # only 3 free cells besides the agent
    for seed in range(20):
        assert 1 <= bfs_distance(draw_layout(tight, seed)) <= 2


def test_render_puts_colours_in_the_right_cells():
    state = GridState(4, agent=(2, 1), goal=(0, 3), walls=frozenset({(1, 1), (3, 3)}))
    img = render(state, 64)
    assert img.size == (64, 64) and img.mode == "RGB"
    assert img.getpixel(centre((2, 1))) == AGENT_COLOUR
    assert img.getpixel(centre((0, 3))) == GOAL_COLOUR
    assert img.getpixel(centre((1, 1))) == img.getpixel(centre((3, 3))) == WALL_COLOUR
    assert img.getpixel(centre((0, 0))) == EMPTY_COLOUR
    assert img.getpixel((16, 32)) == LINE_COLOUR  # top-left corner of cell (2, 1): its outline
    # the agent's pixels stay inside its own 16x16 block (= one image token)
    red = {(x, y) for x in range(64) for y in range(64) if img.getpixel((x, y)) == AGENT_COLOUR}
    assert red and all(16 <= x < 32 and 32 <= y < 48 for x, y in red)
    assert render(state, 64).tobytes() == img.tobytes()  # pure
    on_goal = render(GridState(4, (0, 3), (0, 3), frozenset()), 64)
    assert on_goal.getpixel(centre((0, 3))) == AGENT_COLOUR
    assert on_goal.getpixel((48 + 3, 3)) == GOAL_COLOUR  # a green rim around the agent


def test_env_observation_matches_its_state():
    env = GridEnv(GridParams(size=5, image_size=80))
    obs = env.reset(train_seed(3))
    assert obs.image.getpixel(centre(env.agent)) == AGENT_COLOUR
    assert obs.image.getpixel(centre(env.goal)) == GOAL_COLOUR


@pytest.mark.parametrize("text,action", [
    ("Action: up", "up"),
    ("x Action: Up.", "up"),
    ("I am at row 2. Action: left", "left"),
    ("thought\nACTION:down \n", "down"),
    ("My reaction: calm. Action: right.", "right"),
    ("Action: up Action: down", None),
    ("Action: jump", None),
    ("up", None),
    ("Action: up and more", None),
    ("Action: up..", None),
    ("Action: upward", None),
    ("Action up", None),
    ("", None),
])
def test_parse_action(text, action):
    assert parse_action(text) == action
    assert (action_start(text) is None) == (action is None)


def test_action_start():
    text = "I am at row 2, column 1. Action: up"
    assert action_start(text) == 25 and text[25:] == "Action: up"
    assert action_start("Action: left") == 0
    assert action_start("so action: down.") == 3
    assert action_start("Action: up Action: down") is None


def test_reward_sequence_of_a_hand_written_episode():
    # . . . .     A = agent (1, 0), G = goal (1, 2), # = wall (1, 1)
    # A # G .
    # . . . .
    # . . . .
    env = GridEnv.from_layout(P, agent=(1, 0), goal=(1, 2), walls=[(1, 1)])
    steps = [("Action: right", -0.5, (1, 0), False),   # into the wall: no move
             ("Action: left", -0.5, (1, 0), False),    # off the grid
             ("no action here", -0.5, (1, 0), False),  # unparsed
             ("Action: up", 0.05, (0, 0), True),
             ("Action: right", 0.05, (0, 1), True),
             ("Action: right", 0.05, (0, 2), True)]
    texts = []
    for i, (text, reward, agent, legal) in enumerate(steps, start=1):
        r = env.step(text)
        assert r.reward == pytest.approx(reward) and env.agent == agent and not r.done
        assert r.info == {"legal": legal, "parsed": text.startswith("Action"),
                          "action": parse_action(text), "success": False, "turn": i}
        texts.append(r.observation.text)
    assert texts[:4] == [f"Turn 2 of 8. Your last move was blocked. {INSTRUCTION}",
                         f"Turn 3 of 8. Your last move was blocked. {INSTRUCTION}",
                         f"Turn 4 of 8. Your last answer had no valid action. {INSTRUCTION}", f"Turn 5 of 8. {INSTRUCTION}"]
    r = env.step("I see it. Action: down")
    assert r.reward == pytest.approx(1.05) and r.done and r.observation is None
    assert r.info["success"] and env.success and env.done and env.turn == 7
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("Action: up")


def test_max_turns_ends_an_episode():
    env = GridEnv.from_layout(GridParams(max_turns=3), agent=(0, 0), goal=(3, 3), walls=[])
    results = [env.step("Action: up") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert not env.success and results[-1].observation is None and results[-1].reward == -0.5
    with pytest.raises(RuntimeError):
        env.step("Action: down")
    env.reset(1)  # a new episode after done
    assert env.turn == 0 and not env.done


def test_stepping_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        GridEnv().step("Action: up")


def test_solver_output():
    state = GridState(4, agent=(2, 1), goal=(0, 3), walls=frozenset())
    assert solve(state) == "I am at row 2, column 1. The goal is at row 0, column 3. Action: up"
    blocked = GridState(4, agent=(2, 1), goal=(0, 1), walls=frozenset({(1, 1)}))
    assert solve(blocked).endswith("Action: left")  # up is walled off; left before right
    assert parse_action(solve(state)) == "up"


def test_expert_episodes_succeed_in_bfs_distance_turns():
    for i in range(200):
        seed = train_seed(i)
        episode = expert_episode(P, seed)
        assert len(episode) == bfs_distance(draw_layout(P, seed))
        assert episode[0][0].text == INSTRUCTION
        assert all(parse_action(text) for _, text in episode)
    env = GridEnv()
    env.reset(5)
    while not env.done:
        assert env.step(solve(env)).info["legal"]
    assert env.success


def test_train_and_eval_seeds_are_disjoint():
    assert train_seed(0) == 0 and eval_seed(0) == EVAL_SEED_OFFSET
    assert max(train_seed(i) for i in (0, EVAL_SEED_OFFSET - 1)) < eval_seed(0)
    with pytest.raises(ValueError):
        train_seed(EVAL_SEED_OFFSET)
    with pytest.raises(ValueError):
        eval_seed(-1)


@pytest.mark.parametrize("kwargs,field", [
    ({"size": 1, "image_size": 64}, "size"),
    ({"walls": 15}, "walls"),
    ({"walls": -1}, "walls"),
    ({"image_size": 62}, "image_size"),
    ({"size": 8, "image_size": 24}, "image_size"),
    ({"max_turns": 0}, "max_turns"),
    ({"size": 4.0}, "size"),
])
def test_bad_params(kwargs, field):
    with pytest.raises(ValueError, match=f"GridParams.{field}"):
        GridParams(**kwargs)


def test_make_env():
    env = make_env("grid", size=5, image_size=80)
    assert isinstance(env, GridEnv) and env.params.size == 5
    with pytest.raises(ValueError, match="grid"):
        make_env("maze")
    with pytest.raises(ValueError, match="colour"):
        make_env("grid", colour=3)


def test_from_layout_validates():
    with pytest.raises(ValueError, match="differ"):
        GridEnv.from_layout(P, (0, 0), (0, 0), [])
    with pytest.raises(ValueError, match="inside"):
        GridEnv.from_layout(P, (0, 0), (4, 0), [])
    with pytest.raises(ValueError, match="walls"):
        GridEnv.from_layout(P, (0, 0), (1, 0), [(1, 0)])
