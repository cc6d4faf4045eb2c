"""Thought-collapse figures of a step's episodes, against hand-computed values: BLEU-4 with add-one smoothing,
self-BLEU within an episode, distinct thoughts per state, thought length and entropy over thought tokens."""
import math
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from protege.rl.thought_stats import (
    bleu,
    distinct_per_state,
    observation_keys,
    self_bleu,
    thought_metrics,
    thought_of,
    words,
)


def w(text):
    return text.split()


def test_bleu_identical_is_one_and_no_common_word_is_zero():
    assert bleu(w("a b c d"), [w("a b c d")]) == pytest.approx(1.0)
    assert bleu(w("a b c d"), [w("e f g h")]) == 0.0
    assert bleu([], [w("a")]) == 0.0 and bleu(w("a"), []) == 0.0


def test_bleu_smooths_orders_two_to_four_by_add_one():
    # p1 = 4/5; p2 = (3+1)/(4+1); p3 = (2+1)/(3+1); p4 = (1+1)/(2+1); equal lengths: BP = 1
    expected = (4 / 5 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25
    assert bleu(w("a b c d e"), [w("a b c d f")]) == pytest.approx(expected)
    assert expected == pytest.approx(0.752121, abs=1e-6)


def test_bleu_brevity_penalty_and_clipping():
    # "a b" in "a b c d": every p_n is 1 (p3, p4: (0+1)/(0+1)), BP = exp(1 - 4/2)
    assert bleu(w("a b"), [w("a b c d")]) == pytest.approx(math.exp(-1))
    # "the" counts once (clipped by the reference): p1 = 1/3, p2 = (0+1)/(2+1), p3 = (0+1)/(1+1), p4 = 1
    assert bleu(w("the the the"), [w("the cat")]) == pytest.approx((1 / 3 * 1 / 3 * 1 / 2) ** 0.25)
    # references of length 2 and 4 are as close to 3: the shorter counts, so c > r and BP = 1
    assert bleu(w("x y z"), [w("x y"), w("q r s t")]) == pytest.approx(bleu(w("x y z"), [w("x y")]))
    # clipping takes the largest count in any one reference: "a a" against refs "a" and "a a"
    assert bleu(w("a a"), [w("a"), w("a a")]) == pytest.approx(1.0)


def test_self_bleu_within_an_episode():
    assert self_bleu(["go up", "go up", "go up"]) == pytest.approx(1.0)
    assert self_bleu(["a b", "c d"]) == 0.0
    assert self_bleu(["alone"]) is None
    # turn 1 against turn 2 and back: both are BLEU("a b c d e", "a b c d f")
    assert self_bleu(["a b c d e", "a b c d f"]) == pytest.approx(0.752121, abs=1e-6)


def test_words_and_thought_split():
    assert words("Go UP, now.") == ["go", "up", ",", "now", "."]
    assert thought_of("I see the goal above. Action: up") == "I see the goal above."
    assert thought_of("  no action at all ") == "no action at all"
    assert thought_of("Action: left") == ""


def test_distinct_thoughts_per_state_pools_the_states_seen_twice():
    samples = [("s1", "a"), ("s1", "a"), ("s1", "b"), ("s2", "c"), ("s3", "d"), ("s3", "d")]
    assert distinct_per_state(samples) == pytest.approx((2 + 1) / (3 + 2))  # s2 is seen once: left out
    assert distinct_per_state([("s1", "a"), ("s2", "a")]) is None
    assert distinct_per_state([("s", "a"), ("s", "b")]) == 1.0


def _obs(text, colour):
    return SimpleNamespace(text=text, image=Image.new("RGB", (64, 64), colour))


def _episode(processor, outputs, boards, context):
    """An episode of the given turn outputs, observation i showing board i (a colour)."""
    from protege.rollout.episodes import Episode, add_observation, add_policy_turn, start_episode

    tok, eos = processor.tokenizer, processor.eos_token_id
    if context == "full":
        ep = start_episode(processor, _obs("What is in the picture?", boards[0]))
        for j, text in enumerate(outputs):
            add_policy_turn(ep, tok(text, add_special_tokens=False)["input_ids"] + [eos], text, eos)
            if j + 1 < len(outputs):
                add_observation(processor, ep, _obs("What is in the picture?", boards[j + 1]))
        return ep
    ep = Episode(ids=[], loss_mask=[], turn_of=[], per_turn=[])
    for text, board in zip(outputs, boards):
        seq = start_episode(processor, _obs("What is in the picture?", board))
        add_policy_turn(seq, tok(text, add_special_tokens=False)["input_ids"] + [eos], text, eos)
        ep.per_turn.append(seq)
        ep.texts.append(text)
    return ep


@pytest.mark.parametrize("context", ["full", "current"])
def test_thought_metrics_of_a_step(tiny_processor, context):
    from protege.rollout.episodes import pack_episodes

    red, blue = (255, 0, 0), (0, 0, 255)
    eps = [_episode(tiny_processor, ["row 1. Action: up", "row 1. Action: up"], [red, blue], context),
           _episode(tiny_processor, ["row 2. Action: up", "what is in the picture"], [red, red], context)]
    keys = [observation_keys(e) for e in eps]
    assert keys[0][0] == keys[1][0] and keys[0][1] != keys[1][1]  # the same first board; another board after
    assert keys[1][0] != keys[1][1] if context == "full" else keys[1][0] == keys[1][1]  # full: the history differs
    batch = pack_episodes(tiny_processor, eps)
    entropy = torch.where(batch.loss_mask.bool(), 2.0, 0.0)  # [N, L] 2 nats on every policy token
    from protege.rl.guidance.merged_teacher import thought_mask

    thought = thought_mask(batch, tiny_processor)
    entropy = entropy + thought  # thought tokens: 3 nats, the action and end of turn: 2
    m = thought_metrics(eps, batch, entropy, tiny_processor)
    assert m["thought_entropy"] == pytest.approx(3.0)
    assert m["thought_tokens"] == pytest.approx(float(thought.sum()) / 4)
    n_thought = [len(tiny_processor.tokenizer(t, add_special_tokens=False)["input_ids"])
                 for t in ("row 1.", "row 1.", "row 2.", "what is in the picture")]
    assert abs(float(thought.sum()) - sum(n_thought)) <= 4  # a token may straddle the thought's end
    # the first board, seen by both episodes' first turns: "row 1." and "row 2.", 2 distinct of 2; under
    # context current the second episode's two red boards are one more state: "row 2." and "what is ..."
    assert m["distinct_thoughts_per_state"] == pytest.approx(1.0)
    # episode 1 repeats its thought (self-BLEU 1), episode 2 shares no word between its turns (0)
    assert m["thought_self_bleu"] == pytest.approx(0.5)


def test_thought_metrics_leave_out_what_has_nothing_to_measure(tiny_processor):
    from protege.rollout.episodes import pack_episodes

    eps = [_episode(tiny_processor, ["Action: up"], [(0, 0, 0)], "full")]
    batch = pack_episodes(tiny_processor, eps)
    m = thought_metrics(eps, batch, torch.zeros(batch.loss_mask.shape), tiny_processor)
    assert m == {"thought_tokens": 0.0}
