"""The scripted expert for Points24: a formula from `solve_hand` (the fewest tokens, then the fewest fractional
or negative inner results), written one token per turn as the model should write it: a thought that names
the cards (as the image shows them, left to right) and the plan, then the action. The words vary: each
turn's phrasings are drawn from a generator seeded by the episode's seed and the turn, so the same episode
is always written the same way and different episodes are written differently. Its episodes are the SFT
warm-start data before agent RL on this game."""
from __future__ import annotations

import random

from protege.world.envs.grid import Observation
from protege.world.envs.points24 import (ALL_TOKENS, EQUALS, UNPARSED, Points24Env, Points24Params,
                                         draw_hand, formula_steps, instruction, solve_hand, tree_tokens)

# {cards}: the hand in the image's order; {plan}: the whole formula; {steps}: its inner results in order
CARDS = ("I see {cards}.", "The cards are {cards}.", "Cards: {cards}.", "My hand is {cards}.",
         "The image shows {cards}.")
PLAN = ("{plan}={target}.", "Plan: {plan}.", "{steps}.", "I can make {target} as {plan}.", "{target} is {plan}.")
FIRST = ("I start with {token}.", "First {token}.", "It begins with {token}.")
NEXT = ("After {done} comes {token}.", "So far {done}, next {token}.", "Next is {token}.")
LAST = ("The formula is complete.", "{plan} is done, so =.", "All cards are used: =.")


def card_list(hand: tuple[int, ...], style: int) -> str:
    """The hand as a list: "3, 8, 2 and 4", "3, 8, 2, 4" or "3 8 2 4" (style 0, 1, 2)."""
    values = [str(v) for v in hand]
    if style == 0 and len(values) > 1:
        return ", ".join(values[:-1]) + " and " + values[-1]
    return (", " if style == 1 else " ").join(values)


def plan_tokens(params: Points24Params, hand: tuple[int, ...]) -> list[str]:
    """The solver's formula for the hand, token by token (`=` not included)."""
    tree = solve_hand(hand, params.target, params.operators)
    if tree is None:
        raise ValueError(f"the hand {hand} has no formula for {params.target} with {params.operators}")
    return tree_tokens(tree)


def thought(params: Points24Params, hand: tuple[int, ...], plan: list[str], turn: int, rng: random.Random) -> str:
    """The thought before token `turn` of `plan` (`=` after the last): the cards, the plan, the next token."""
    expr = "".join(plan)
    fill = {"target": params.target, "plan": expr, "steps": ", ".join(formula_steps(plan))}
    parts = [rng.choice(CARDS).format(cards=card_list(hand, rng.randrange(3))), rng.choice(PLAN).format(**fill)]
    if turn == len(plan):
        parts.append(rng.choice(LAST).format(**fill))
    elif turn == 0:
        parts.append(rng.choice(FIRST).format(token=plan[0]))
    else:
        parts.append(rng.choice(NEXT).format(done="".join(plan[:turn]), token=plan[turn]))
    return " ".join(parts)


def solve(env: Points24Env, seed: int | None = None) -> str:
    """The expert's whole turn output for the env's current formula (which must be a prefix of the solver's
    plan), e.g. "I see 3, 8, 2 and 4. Plan: (2+4-3)*8. Next is 4. Action: 4"; phrasings drawn from `seed`
    (default: the env's seed) and the turn."""
    plan = plan_tokens(env.params, env.hand)
    turn = len(env.formula)
    if list(env.formula) != plan[:turn]:
        raise ValueError(f"the formula {''.join(env.formula)!r} is not a start of the plan {''.join(plan)!r}")
    key = seed if seed is not None else env.seed
    rng = random.Random(f"points24-thought:{key}:{turn}")
    token = plan[turn] if turn < len(plan) else EQUALS
    return f"{thought(env.params, env.hand, plan, turn, rng)} Action: {token}"


def expert_episode(params: Points24Params, seed: int) -> list[tuple[Observation, str]]:
    """The episode of `seed` played by the solver: each turn's observation and the solver's output. It always
    ends on `=` with the formula equal to the target (hands are drawn solvable)."""
    env = Points24Env(params)
    obs = env.reset(seed)
    turns = []
    while True:
        text = solve(env)
        turns.append((obs, text))
        result = env.step(text)
        if result.done:
            break
        obs = result.observation
    if not env.success:
        raise RuntimeError(f"the solver failed seed {seed} with {params}: a solver bug")
    return turns


def all_texts(params: Points24Params = Points24Params()) -> list[str]:
    """The game's fixed texts: the instruction, the notes, every action, and each phrasing with a sample hand
    (for training a tokenizer on the world's text)."""
    texts = [instruction(params), UNPARSED] + [f"Action: {t}" for t in ALL_TOKENS]
    hand = draw_hand(params, 0)
    plan = plan_tokens(params, hand)
    fill = {"target": params.target, "plan": "".join(plan), "steps": ", ".join(formula_steps(plan)),
            "cards": card_list(hand, 0), "token": plan[0], "done": plan[0]}
    texts += [t.format(**fill) for t in CARDS + PLAN + FIRST + NEXT + LAST]
    return texts
