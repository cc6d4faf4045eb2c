"""Reward functions as a user writes them for rl.rewards: keyword arguments in, one float per response out."""
import math

CALLS: list[dict] = []  # each call's arguments, for the tests that read what a function was given
NOT_A_FUNCTION = 3


def has_letter(questions, references, responses, images, ids, is_teacher):
    """1.0 for a response with an 'e' in it (the tiny student's answers vary in it)."""
    CALLS.append(dict(questions=questions, references=references, responses=responses, images=images, ids=ids,
                      is_teacher=is_teacher))
    return [1.0 if "e" in r else 0.0 for r in responses]


def length(responses, **_):
    return [len(r) / 10 for r in responses]


def one_short(responses, **_):
    return [0.0] * (len(responses) - 1)


def nan_for_first(responses, **_):
    return [math.nan] + [0.0] * (len(responses) - 1)


def raises(responses, **_):
    raise KeyError("no score for this response")


def not_numbers(responses, **_):
    return ["good"] * len(responses)
