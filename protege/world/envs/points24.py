"""Points24: a seeded multi-turn card game for visual agent RL (RL4VLM's gym-cards Points24 and EZPoints, as
GTR-Turbo trains on them).

The image shows a hand of `cards` cards side by side; the task is to write a formula that uses every card
exactly once and equals the target, one token per turn:
- 4 cards (Points24): target 24, tokens: the card values 1..10, `+ - * / ( )` and `=`.
- 2 cards (EZPoints): target 12, tokens: the card values 1..10, `+ *` and `=`.
`target` may be set to another number. Card values: a card is drawn as in gym-cards, uniformly from
A, 2..10, J, Q, K, with the ace counting 1 and J, Q, K counting 10 (gym-cards' `treat_face_cards_as_10`,
the setting GTR-Turbo's code runs); the image shows the value (a face card is drawn as 10), so a value of 10
is 4/13 likely and 1..9 1/13 each. Only hands with a solution are drawn (gym-cards' Points24 also draws
hands with none, which can only fail; its EZPoints draws solvable pairs only): `reset` redraws from the same
seeded generator until the hand has one (`solve_hand`).

The image: `cards` panels side by side, each `image_size / cards` px wide and `image_size` px high, one per
card in the hand's order (left to right). A panel is a white card with a thin grey outline and the value in
large seven-segment digits (10 as a 1 above a 0), nothing else; so a panel's pixels depend on its own card
alone. With the defaults (64 px; the student's image token is 16x16 px) each card is one column of 4 image
tokens (4 cards) or two columns (2 cards). The image stays the same all episode: the cards are never in the
text, and the formula so far is only in the text.

Each turn the model writes a free thought, then `Action: <token>` (see `parse_action`). Rules (gym-cards',
with GTR-Turbo's wrapper ending the episode at any -1):
- a number must be one of the cards not yet used (an unavailable or reused value is illegal), written where
  a number may stand (at the start, after an operator or `(`);
- `+ - * /` may follow a number or `)`; `(` may stand where a number may; `)` may follow a number or `)`
  and close an open `(`; there is no unary minus and no two numbers in a row (gym-cards would read 3 then 4
  as 34);
- an illegal token gives `wrong_reward` and ends the episode; a legal one gives 0;
- `=` ends the episode and is judged: `correct_reward` when the formula is complete, uses every card
  exactly once and equals the target (exact arithmetic, fractions.Fraction; a division by zero is
  wrong), else `wrong_reward`;
- reaching `max_turns` without `=` gives `wrong_reward` on the last turn (gym-cards: -1 once the formula
  passes 20 elements).
An output that does not parse plays a random token instead (GTR-Turbo's code executes a uniformly random
action): drawn from a generator seeded by the episode's seed and the turn, so replays are exact. That turn
counts as a format error (`info["legal"]` is False) whatever the token does.

Seeds: `reset(seed)` draws the hand from `random.Random(seed)` alone; train on `train_seed(i)`, evaluate
on `eval_seed(i)` (the grid game's split).
"""
from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import gcd

from PIL import Image, ImageDraw

from protege.world.envs.grid import EVAL_SEED_OFFSET, Observation, StepResult, eval_seed, train_seed
from protege.world.envs.tool import draw_digit

__all__ = ["EVAL_SEED_OFFSET", "NUMBERS", "Points24Env", "Points24Params", "action_start", "draw_hand",
           "eval_seed", "evaluate", "parse_action", "render", "solve_hand", "train_seed"]

NUMBERS = tuple(str(v) for v in range(1, 11))
BINARY = ("+", "-", "*", "/")
OPERATORS = {4: ("+", "-", "*", "/", "(", ")"), 2: ("+", "*")}  # per hand size: Points24, EZPoints
TARGETS = {4: 24, 2: 12}
EQUALS = "="
ALL_TOKENS = NUMBERS + OPERATORS[4] + (EQUALS,)
MAX_DRAWS = 10_000

PAPER = (255, 255, 255)
OUTLINE = (160, 160, 160)

UNPARSED = "Your last answer had no valid action: a random token was played."


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and abs(value) != float("inf")


def longest_formula(cards: int) -> int:
    """The most tokens the solver's formula has before `=`: the cards, the operators between them, and
    (4 cards) at most two pairs of brackets (a binary tree with 4 leaves has 2 inner nodes below its root)."""
    return 2 * cards - 1 + (2 * (cards - 2) if "(" in OPERATORS[cards] else 0)


@dataclass(frozen=True)
class Points24Params:
    cards: int = 4                 # 4: Points24 (+ - * / ( ), target 24); 2: EZPoints (+ *, target 12)
    target: int | None = None      # None: the setting's own (24 with 4 cards, 12 with 2)
    max_turns: int = 15            # tokens per episode, `=` included; the solver's longest formula is 11 + `=`
    image_size: int = 64           # pixels per side; a multiple of `cards`
    correct_reward: float = 10.0
    wrong_reward: float = -1.0

    def __post_init__(self) -> None:
        for name in ("cards", "max_turns", "image_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"Points24Params.{name} must be an int, got {value!r}")
        if self.cards not in OPERATORS:
            raise ValueError(f"Points24Params.cards must be 4 (Points24) or 2 (EZPoints), got {self.cards}")
        if self.target is None:
            object.__setattr__(self, "target", TARGETS[self.cards])
        if not isinstance(self.target, int) or isinstance(self.target, bool) or self.target < 1:
            raise ValueError(f"Points24Params.target must be a positive int or None, got {self.target!r}")
        need = longest_formula(self.cards) + 1
        if self.max_turns < need:
            raise ValueError(f"Points24Params.max_turns must be >= {need} with {self.cards} cards (the longest "
                             f"formula and `=`), got {self.max_turns}")
        if self.image_size % self.cards or self.image_size // self.cards < 8:
            raise ValueError(f"Points24Params.image_size must be a multiple of cards={self.cards} with panels "
                             f"of >= 8 px, got {self.image_size}")
        for name in ("correct_reward", "wrong_reward"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"Points24Params.{name} must be a finite number, got {getattr(self, name)!r}")

    @property
    def operators(self) -> tuple[str, ...]:
        return OPERATORS[self.cards]

    @property
    def tokens(self) -> tuple[str, ...]:
        """Every token the game knows: the values 1..10, its operators, `=`."""
        return NUMBERS + self.operators + (EQUALS,)

    @property
    def panel_px(self) -> int:
        return self.image_size // self.cards

    def describe(self) -> str:
        return (f"{self.cards} cards, {' '.join(self.operators)}, target {self.target}, "
                f"at most {self.max_turns} turns")


# ------------------------------------------------------------------------------------------ arithmetic

Tree = int | tuple  # a card value, or (op, left, right)
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def parse_tree(tokens: list[str] | tuple[str, ...]) -> Tree | None:
    """The expression tree of a formula as it is read (precedence, then left to right), or None when the
    tokens are not a complete formula."""
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def atom() -> Tree | None:
        nonlocal pos
        tok = peek()
        if tok == "(":
            pos += 1
            inner = expr()
            if inner is None or peek() != ")":
                return None
            pos += 1
            return inner
        if tok is not None and tok.isdigit():
            pos += 1
            return int(tok)
        return None

    def chain(sub, ops) -> Tree | None:
        nonlocal pos
        tree = sub()
        while tree is not None and peek() in ops:
            op = tokens[pos]
            pos += 1
            right = sub()
            tree = None if right is None else (op, tree, right)
        return tree

    def term() -> Tree | None:
        return chain(atom, ("*", "/"))

    def expr() -> Tree | None:
        return chain(term, ("+", "-"))

    tree = expr()
    return tree if pos == len(tokens) else None


def value_of(tree: Tree) -> Fraction | None:
    """The tree's value in exact fractions; None when it divides by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = value_of(left), value_of(right)
    return None if a is None or b is None else _apply(op, a, b)


def evaluate(tokens: list[str] | tuple[str, ...]) -> Fraction | None:
    """The value of a formula given as tokens (numbers and `+ - * / ( )`), with the usual precedence and
    left-to-right order, in exact fractions; None when it is not a complete formula or divides by zero."""
    tree = parse_tree(tokens)
    return None if tree is None else value_of(tree)


def _needs_brackets(op: str, child_root: str | None, side: str) -> bool:
    """Whether an operand whose top operator is `child_root` (None: a number) needs brackets under `op`: a
    lower-precedence one does, and so does an equal one on the right of - or /."""
    if child_root is None:
        return False
    inner, outer = PRECEDENCE[child_root], PRECEDENCE[op]
    return inner < outer or (side == "right" and inner == outer and op in ("-", "/"))


def tree_tokens(tree: Tree) -> list[str]:
    """The formula of an expression tree with the fewest brackets that keep its value."""
    if isinstance(tree, int):
        return [str(tree)]
    op, left, right = tree
    out = []
    for side, sub in (("left", left), ("right", right)):
        toks = tree_tokens(sub)
        if _needs_brackets(op, None if isinstance(sub, int) else sub[0], side):
            toks = ["("] + toks + [")"]
        out += toks
        if side == "left":
            out.append(op)
    return out


def _show(value: Fraction) -> str:
    """A value as an operand in a step: 7, -1 as (-1), 8/3 as (8/3)."""
    if value.denominator == 1 and value >= 0:
        return str(value.numerator)
    return f"({value.numerator}/{value.denominator})" if value.denominator != 1 else f"({value.numerator})"


def formula_steps(tokens: list[str] | tuple[str, ...]) -> list[str]:
    """The formula's inner results in the order it is read, e.g. "(8-4)*6" -> ["8-4=4", "4*6=24"]."""
    tree = parse_tree(tokens)
    if tree is None:
        raise ValueError(f"not a complete formula: {''.join(tokens)!r}")
    steps: list[str] = []

    def walk(t: Tree) -> Fraction:
        if isinstance(t, int):
            return Fraction(t)
        op, left, right = t
        a, b = walk(left), walk(right)
        value = _apply(op, a, b)
        if value is None:
            raise ValueError(f"{''.join(tokens)!r} divides by zero")
        shown = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        steps.append(f"{_show(a)}{op}{_show(b)}={shown}")
        return value

    walk(tree)
    return steps


Rational = tuple[int, int]  # (numerator, denominator > 0) in lowest terms: the solver's fast exact numbers


def _q_apply(op: str, a: Rational, b: Rational) -> Rational | None:
    (p, q), (r, s) = a, b
    if op == "+":
        num, den = p * s + r * q, q * s
    elif op == "-":
        num, den = p * s - r * q, q * s
    elif op == "*":
        num, den = p * r, q * s
    elif r == 0:
        return None
    else:
        num, den = (p * s, q * r) if r > 0 else (-p * s, -q * r)
    g = gcd(num, den)
    return num // g, den // g


@lru_cache(maxsize=4096)
def _solve_sorted(cards: tuple[int, ...], target: int, ops: tuple[str, ...]) -> Tree | None:
    """Dynamic programming over the subsets of the cards: per subset, per (value, precedence of the top
    operator), the tree ranked first by (tokens, inner results that are not whole numbers >= 0), ties to the
    first found. The brackets an operand needs depend only on its top operator's precedence, so the ranks
    add up and the best is exact. The whole hand keeps only trees whose value is the target."""
    binary = [op for op in ops if op in BINARY]
    brackets = "(" in ops
    n, full, goal = len(cards), (1 << len(cards)) - 1, (target, 1)
    Entry = tuple[tuple[int, int], Tree]
    best: dict[int, dict[tuple[Rational, str | None], Entry]] = {
        1 << i: {((c, 1), None): ((1, 0), c)} for i, c in enumerate(cards)}
    found: Entry | None = None
    for mask in sorted(range(1, full + 1), key=lambda m: (bin(m).count("1"), m)):
        if mask in best:
            continue
        table: dict[tuple[Rational, str | None], Entry] = {}
        sub = (mask - 1) & mask
        while sub:
            other = mask ^ sub
            for (va, ra), ((ta, na), tree_a) in best[sub].items():
                for (vb, rb), ((tb, nb), tree_b) in best[other].items():
                    for op in binary:
                        if op in ("+", "*") and sub > other:
                            continue  # commutative: the other split gives it
                        value = _q_apply(op, va, vb)
                        if value is None or (mask == full and value != goal):
                            continue
                        extra = _needs_brackets(op, ra, "left") + _needs_brackets(op, rb, "right")
                        if extra and not brackets:
                            continue
                        rank = (ta + tb + 1 + 2 * extra, na + nb + (value[1] != 1 or value[0] < 0))
                        if mask == full:
                            if found is None or rank < found[0]:
                                found = (rank, (op, tree_a, tree_b))
                            continue
                        key = (value, "+" if PRECEDENCE[op] == 1 else "*")  # the precedence is what counts
                        if key not in table or rank < table[key][0]:
                            table[key] = (rank, (op, tree_a, tree_b))
            sub = (sub - 1) & mask
        best[mask] = table
    if n == 1:
        return cards[0] if cards[0] == target else None
    return None if found is None else found[1]


def solve_hand(cards: tuple[int, ...] | list[int], target: int, operators: tuple[str, ...]) -> Tree | None:
    """A formula for the hand as an expression tree, or None when it has none: among the trees over the cards
    (each once) whose value is `target`, one with the fewest tokens (brackets included), then the fewest
    inner results that are fractions or negative. It depends on the hand as a multiset only (the cards are
    sorted first), so every order of a hand gets the same plan."""
    return _solve_sorted(tuple(sorted(cards)), target, tuple(operators))


# ------------------------------------------------------------------------------------------ hands and images


def draw_hand(params: Points24Params, seed: int) -> tuple[int, ...]:
    """The hand for `seed`, from `random.Random(seed)` alone: cards A..K (J, Q, K counting 10), redrawn
    until the hand has a solution."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    for _ in range(MAX_DRAWS):
        hand = tuple(min(rng.randint(1, 13), 10) for _ in range(params.cards))
        if solve_hand(hand, params.target, params.operators) is not None:
            return hand
    raise RuntimeError(f"no solvable hand in {MAX_DRAWS} draws for {params} and seed {seed}; "
                       f"choose another target")


def render(hand: tuple[int, ...] | list[int], image_size: int) -> Image.Image:
    """The hand as an RGB image: a pure function of (hand, image_size), one panel per card."""
    n = len(hand)
    if not n or image_size % n or image_size // n < 8:
        raise ValueError(f"image_size must be a multiple of the {n} cards with panels of >= 8 px, "
                         f"got {image_size}")
    w, h = image_size // n, image_size
    side = min(w, h // 2)  # one digit's square
    img = Image.new("RGB", (image_size, image_size), PAPER)
    draw = ImageDraw.Draw(img)
    for i, value in enumerate(hand):
        if not isinstance(value, int) or not 1 <= value <= 10:
            raise ValueError(f"card values are ints 1..10, got {value!r}")
        x0 = i * w
        draw.rectangle([x0, 0, x0 + w - 1, h - 1], outline=OUTLINE)
        digits = str(value)
        slots = h // side
        top = (slots - len(digits)) // 2 * side  # the digits stacked, centred on whole digit squares
        for k, ch in enumerate(digits):
            draw_digit(draw, int(ch), x0 + (w - side) // 2, top + k * side, side)
    return img


# ------------------------------------------------------------------------------------------ actions

# One "Action:" marker (as a word, any case), one token, then at most a full stop.
_MARKER = re.compile(r"(?<![A-Za-z0-9_])action:", re.IGNORECASE)
_ACTION = re.compile(r"action:\s*(10|[1-9]|[-+*/()=])\s*\.?\s*\Z", re.IGNORECASE)


def action_start(text: str) -> int | None:
    """Where the action part ("Action: <token>") begins in `text`, any token of the game's vocabulary
    (values 1..10, `+ - * / ( ) =`): everything before it is the thought. None when there is none."""
    markers = list(_MARKER.finditer(text))
    if len(markers) != 1 or not _ACTION.match(text, markers[0].start()):
        return None
    return markers[0].start()


def parse_action(text: str, tokens: tuple[str, ...] = ALL_TOKENS) -> str | None:
    """The token in a model's whole turn output, or None unless it is exactly `<thought> Action: <token>`:
    exactly one `Action:` marker (case-insensitive, not inside a word), then one token of `tokens` (a value
    1..10 or an operator), then nothing but whitespace and at most one full stop. The thought may be empty."""
    start = action_start(text)
    if start is None:
        return None
    match = _ACTION.match(text, start)
    assert match is not None
    return match.group(1) if match.group(1) in tokens else None


# ------------------------------------------------------------------------------------------ the env


def instruction(params: Points24Params) -> str:
    return (f"Use every card in the image once to make {params.target} with {' '.join(params.operators)}. "
            f"Write one token per turn: a card's number or an operator, then = to finish. "
            f"Answer with a thought, then 'Action: <token>'.")


def formula_text(formula: list[str] | tuple[str, ...]) -> str:
    """The formula as the text shows it: tokens run together, e.g. "(8-4)*"."""
    return "".join(formula) if formula else "nothing yet"


def observation_text(params: Points24Params, turn: int, formula: tuple[str, ...], unparsed: bool = False) -> str:
    """The text before token `turn + 1`: the turn count, a note when the last answer did not parse, the
    task, and the formula so far."""
    head = "" if turn == 0 else f"Turn {turn + 1} of {params.max_turns}. " + (UNPARSED + " " if unparsed else "")
    return f"{head}{instruction(params)} Formula so far: {formula_text(formula)}."


def check_token(token: str, formula: tuple[str, ...], hand: tuple[int, ...], operators: tuple[str, ...]) -> str | None:
    """Why `token` may not come next after `formula` with this hand (a short reason), or None when it may.
    `=` is always accepted here: it is judged by `judge`."""
    prev = formula[-1] if formula else None
    after_operand = prev is not None and (prev.isdigit() or prev == ")")
    depth = formula.count("(") - formula.count(")")
    if token == EQUALS:
        return None
    if token.isdigit():
        if after_operand:
            return "a number must follow an operator or ("
        used = Counter(t for t in formula if t.isdigit())
        if used[token] >= Counter(str(c) for c in hand)[token]:
            return f"no unused card {token}"
        return None
    if token not in operators:
        return f"{token} is not an operator of this game"
    if token in BINARY:
        return None if after_operand else f"{token} must follow a number or )"
    if token == "(":
        return "( must not follow a number or )" if after_operand else None
    if not after_operand:
        return ") must follow a number or )"
    return None if depth > 0 else ") closes no ("


def judge(formula: tuple[str, ...], hand: tuple[int, ...], target: int) -> bool:
    """Whether the finished formula uses every card exactly once and equals `target`."""
    used = Counter(t for t in formula if t.isdigit())
    return used == Counter(str(c) for c in hand) and evaluate(formula) == target


class Points24Env:
    """One hand at a time; `reset(seed)` deals one, `step(text)` plays a token."""

    def __init__(self, params: Points24Params = Points24Params()) -> None:
        if not isinstance(params, Points24Params):
            raise ValueError(f"params must be a Points24Params, got {type(params).__name__}")
        self.params = params
        self._hand: tuple[int, ...] | None = None
        self._seed: int | None = None
        self._formula: tuple[str, ...] = ()
        self._turn = 0
        self._done = False
        self._success = False
        self._unparsed = False
        self._image: Image.Image | None = None

    @classmethod
    def from_hand(cls, params: Points24Params, hand: tuple[int, ...] | list[int]) -> Points24Env:
        """An env at turn 0 of a given hand (tests, hand-made games); the hand needs no solution."""
        hand = tuple(hand)
        if len(hand) != params.cards or not all(isinstance(v, int) and 1 <= v <= 10 for v in hand):
            raise ValueError(f"a hand is {params.cards} card values in 1..10, got {hand!r}")
        env = cls(params)
        env._start(hand, seed=None)
        return env

    def _start(self, hand: tuple[int, ...], seed: int | None) -> Observation:
        self._hand, self._seed = hand, seed
        self._formula, self._turn, self._done, self._success, self._unparsed = (), 0, False, False, False
        self._image = render(hand, self.params.image_size)
        return self.observation()

    def reset(self, seed: int) -> Observation:
        return self._start(draw_hand(self.params, seed), seed)

    def observation(self) -> Observation:
        if self._image is None:
            raise RuntimeError("no episode yet: call reset(seed) first")
        return Observation(self._image.copy(),
                           observation_text(self.params, self._turn, self._formula, self._unparsed))

    def random_token(self) -> str:
        """The token an unparseable output plays this turn: uniform over the game's tokens, from a generator
        seeded by the episode's seed (or its hand) and the turn."""
        key = self._seed if self._seed is not None else "hand-" + "-".join(map(str, self.hand))
        return random.Random(f"points24-random-action:{key}:{self._turn}").choice(self.params.tokens)

    def step(self, text: str) -> StepResult:
        hand = self.hand
        if self._done:
            raise RuntimeError(f"the episode is over (turn {self._turn}, success={self._success}); "
                               f"call reset(seed) before stepping again")
        p = self.params
        parsed = parse_action(text, p.tokens)
        token = parsed if parsed is not None else self.random_token()
        why = check_token(token, self._formula, hand, p.operators)
        self._turn += 1
        self._unparsed = parsed is None
        reward, out_of_turns = 0.0, False
        if why is not None:
            reward, self._done = p.wrong_reward, True
        elif token == EQUALS:
            self._success = judge(self._formula, hand, p.target)
            reward, self._done = (p.correct_reward if self._success else p.wrong_reward), True
        else:
            self._formula += (token,)
            if self._turn >= p.max_turns:
                reward, self._done, out_of_turns = p.wrong_reward, True, True
        # legal: the output parsed and its token may stand here (an unparsed turn is a format error whatever
        # its random token did); illegal: why the token may not, else None
        info = {"legal": parsed is not None and why is None, "parsed": parsed is not None, "action": token,
                "success": self._success, "turn": self._turn, "formula": formula_text(self._formula),
                "illegal": why, "out_of_turns": out_of_turns}
        return StepResult(None if self._done else self.observation(), float(reward), self._done, info)

    @property
    def hand(self) -> tuple[int, ...]:
        if self._hand is None:
            raise RuntimeError("no episode yet: call reset(seed) first")
        return self._hand

    @property
    def formula(self) -> tuple[str, ...]:
        return self._formula

    @property
    def seed(self) -> int | None:
        return self._seed

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool:
        return self._success
