"""The scripted expert for the tool environment, written as the model should write it: turn 0 states what
it read from the image (from the true question) and runs one python block that prints the answer; the next
turn boxes what the tool printed. Its episodes are the SFT warm-start data before GTPO; the code really runs
through the env's sandbox, so the tool turns in that data are exactly those the trainer will see.

A `slip` episode of a product question first calls `math.prod` without importing math, reads the NameError
the sandbox reports, and imports it in the next tool call: a warm start trained on some of these makes the
runtime errors that turn-level credit (GTPO) is meant to remove, while the clean program is in its data too."""
from __future__ import annotations

from protege.world.envs.tool import (Observation, Question, Runner, ToolEnv, ToolParams, combine,
                                     parse_int)

OP_SIGNS = {"sum": " + ", "difference": " - ", "product": " * "}


def thought(question: Question) -> str:
    """What the model should say it sees, e.g. "The numbers are 47 and 38." / "Red is 4, blue is 6."."""
    if question.kind == "arithmetic":
        assert question.numbers is not None
        return "The numbers are {} and {}.".format(*question.numbers)
    if question.kind == "chart":
        assert question.bars is not None
        named = question.named or tuple(question.bars)
        said = ", ".join(f"{c} is {question.bars[c]}" for c in named)
        return said[0].upper() + said[1:] + "."
    assert question.scene is not None
    n = question.scene.count
    return "There is 1 shape." if n == 1 else f"There are {n} shapes."


def program(question: Question) -> str:
    """The python that prints the answer, e.g. "print(47 * 38)"."""
    return f"print({OP_SIGNS[question.op].join(str(v) for v in question.operands)})"


def slip_program(question: Question, fixed: bool = False) -> str:
    """`math.prod` over the operands; without its import unless `fixed`."""
    call = f"print(math.prod([{', '.join(str(v) for v in question.operands)}]))"
    return f"import math\n{call}" if fixed else call


def can_slip(question: Question, params: ToolParams) -> bool:
    return question.op == "product" and params.max_tool_calls >= 2


def first_turn(question: Question, use_tool: bool = True) -> str:
    if not use_tool:  # a zero tool budget: the expert still answers, working it out itself
        return final_turn(combine(question.op, question.operands), thought(question) + " ")
    return f"{thought(question)}\n```python\n{program(question)}\n```"


def final_turn(answer: int | str, prefix: str = "") -> str:
    return f"{prefix}The answer is \\boxed{{{answer}}}."


def solve_turns(env: ToolEnv, slip: bool = False) -> list[tuple[Observation, str]]:
    """Plays `env` from its first turn (right after `reset`) to the end: each turn's observation and the
    solver's output. With `slip` (product questions only) the first program fails and the second fixes it.
    Raises RuntimeError unless the episode ends with the right answer."""
    if env.turn != 0 or env.done:
        raise ValueError(f"solve_turns needs an env right after reset (turn {env.turn}, done={env.done})")
    question = env.state
    obs = env.observation()
    turns: list[tuple[Observation, str]] = []
    slipping = slip and can_slip(question, env.params)
    text = (f"{thought(question)}\n```python\n{slip_program(question)}\n```" if slipping
            else first_turn(question, use_tool=env.params.max_tool_calls > 0))
    while True:
        turns.append((obs, text))
        result = env.step(text)
        if result.done:
            break
        obs = result.observation
        printed = obs.text.strip()
        if slipping and result.info["runtime_error"] and "NameError" in printed:
            slipping = False
            text = f"I need to import math.\n```python\n{slip_program(question, fixed=True)}\n```"
            continue
        if result.info["runtime_error"] or parse_int(printed) is None:
            raise RuntimeError(f"the solver's code {result.info['code']!r} for seed {env.seed} gave "
                               f"{obs.text!r}, not an integer: is the sandbox working?")
        text = final_turn(printed)
    if not env.success:
        raise RuntimeError(f"the solver failed seed {env.seed} ({question.kind}: {question.text!r}, "
                           f"answer {question.answer}) with turns {[t for _, t in turns]}")
    return turns


def expert_episode(params: ToolParams, seed: int, sandbox: Runner | None = None,
                   slip: bool = False) -> list[tuple[Observation, str]]:
    """The episode of `seed` played by the solver (see `solve_turns`); `sandbox` as in ToolEnv."""
    env = ToolEnv(params, sandbox)
    env.reset(seed)
    return solve_turns(env, slip)
