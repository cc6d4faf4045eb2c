"""Row-keyed sampling: an answer's draws depend on its prompt's seed, never on the batch around it, and they
are exact samples of the warped distribution."""
import math

import pytest
import torch

from protege.generation.row_seeds import RowSeededSampler, row_seed, uniform


def test_uniform_is_a_pure_function_of_key_position_and_index():
    keys = torch.tensor([row_seed(7, 0), row_seed(7, 1), row_seed(8, 0)])
    a = uniform(keys, 3, 50)
    b = uniform(keys[[2, 0]], 3, 50)  # another batch, another order
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(uniform(keys, 4, 50)[0], a[0])
    assert 0.0 < float(a.min()) and float(a.max()) < 1.0
    big = uniform(torch.tensor([row_seed(1)]), 0, 200_000)
    assert abs(float(big.mean()) - 0.5) < 0.005 and abs(float(big.var()) - 1 / 12) < 0.002


def test_row_seed_is_stable_and_spread():
    assert row_seed(1, 2, 3) == row_seed(1, 2, 3) != row_seed(1, 2, 4)
    assert 0 <= row_seed("x") < 2**63


def _draw(sampler, logits, steps=1):
    out = []
    for _ in range(steps):
        scores = sampler(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())
        assert torch.isfinite(scores).sum(dim=1).eq(1).all()  # one-hot: greedy decoding takes the draw
        out.append(scores.argmax(dim=1))
    return torch.stack(out, dim=1)


def test_a_prompt_draws_the_same_alone_or_in_a_batch():
    logits = torch.randn(3, 40)
    together = _draw(RowSeededSampler([11, 22, 33], per_prompt=2), logits.repeat_interleave(2, 0), steps=5)
    alone = _draw(RowSeededSampler([22], per_prompt=2), logits[1:2].repeat_interleave(2, 0), steps=5)
    assert torch.equal(together[2:4], alone)
    assert not torch.equal(together[2], together[3]) or not torch.equal(together[0], together[1])


def test_draws_follow_the_warped_softmax():
    """20,000 rows of one distribution: each token's share is within 4 standard errors of its probability,
    after temperature 0.5 and top-k 3 (the other tokens never come)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    n = 20_000
    sampler = RowSeededSampler(list(range(n)), per_prompt=1, temperature=0.5, top_k=3)
    picks = _draw(sampler, logits.expand(n, -1))[:, 0]
    kept = logits[0, :3] / 0.5
    probs = torch.softmax(kept, dim=0)
    for v in range(5):
        share = float((picks == v).float().mean())
        if v >= 3:
            assert share == 0.0
        else:
            p = float(probs[v])
            assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / n), (v, share, p)


def test_a_wrong_row_count_is_refused():
    sampler = RowSeededSampler([1, 2], per_prompt=2)
    with pytest.raises(ValueError, match="3 rows to sample but 4 row seeds"):
        sampler(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 5))


def test_the_students_answers_do_not_depend_on_the_batch(tiny_student, tiny_processor):
    """Through transformers' generate: a question's two answers are the same sampled with two other questions
    (a longer prompt pads it) or alone, in either order."""
    from PIL import Image

    from protege.generation.transformers_backend import Sampling, sample

    image = Image.new("RGB", (64, 64), "white")
    qs = ["How many red shapes are there?", "Is the blue circle left of the square?", "Count the shapes."]
    sampling = Sampling(do_sample=True, temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=8)
    torch.manual_seed(0)
    three = sample(tiny_student, tiny_processor, tiny_processor.encode_prompts(qs, [image] * 3), sampling, 2,
                   row_seeds=[5, 6, 7], images=[image] * 3)
    torch.manual_seed(1)  # the global generator plays no part
    one = sample(tiny_student, tiny_processor, tiny_processor.encode_prompts(qs[1:2], [image]), sampling, 2,
                 row_seeds=[6], images=[image])
    assert three.texts[2:4] == one.texts
    with pytest.raises(ValueError, match="2 row seeds for 3 prompts"):
        sample(tiny_student, tiny_processor, tiny_processor.encode_prompts(qs, [image] * 3), sampling, 2,
               row_seeds=[1, 2])
