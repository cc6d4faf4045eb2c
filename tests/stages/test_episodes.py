"""Multi-turn episodes: batched generation over episodes of different lengths, turn spans, loss masks,
and a training view of the episodes that scores exactly the tokens the policy generated."""
from dataclasses import dataclass

import pytest
import torch
from PIL import Image

from protege.generation.transformers_backend import Sampling
from protege.rollout.episodes import pack_episodes, play
from protege.rollout.trajectory import token_logprobs


@dataclass
class Obs:
    text: str
    image: Image.Image | None = None
    role: str = "user"


@dataclass
class Step:
    observation: Obs | None
    reward: float
    done: bool
    info: dict


class CountdownEnv:
    """Ends after `seed` turns; every observation is a coloured picture; odd turns answer as a text-only tool."""

    def reset(self, seed):
        self.left, self.turn = seed, 0
        return Obs("start", Image.new("RGB", (64, 64), (200, 10 * seed, 0)))

    def step(self, text):
        self.turn += 1
        self.left -= 1
        done = self.left == 0
        obs = None if done else (Obs(f"tool says {self.turn}", None, "tool") if self.turn % 2 else
                                 Obs(f"turn {self.turn}", Image.new("RGB", (64, 64), (0, 30 * self.turn, 90))))
        return Step(obs, float(self.turn), done, {"success": done and self.turn == 3})


def test_play_episodes_of_different_lengths(tiny_student, tiny_processor):
    torch.manual_seed(0)
    greedy = Sampling(do_sample=False, max_new_tokens=5)
    eps = play(tiny_student, tiny_processor, [CountdownEnv() for _ in range(3)], [1, 3, 4], greedy)
    assert [e.turns for e in eps] == [1, 3, 4]
    assert [e.rewards for e in eps] == [[1.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]
    assert [e.success for e in eps] == [False, True, False]
    assert [len(e.images) for e in eps] == [1, 2, 2]  # the first observation + the picture after turn 2
    tok = tiny_processor.tokenizer
    for e in eps:
        assert len(e.ids) == len(e.loss_mask) == len(e.turn_of)
        for j, (a, b) in enumerate(e.spans):
            assert all(e.loss_mask[a:b]) and all(t == j for t in e.turn_of[a:b])
            # a turn's tokens are exactly what follows its context
            ids, images = e.prefix(j)
            assert ids == e.ids[:a] and len(images) == (1 if j < 2 else 2)  # the picture arrives after turn 2
        assert sum(e.loss_mask) == sum(b - a for a, b in e.spans)
        text = tok.decode(e.ids)
        assert text.count("<|im_start|>assistant") == e.turns
        assert text.count("<|im_start|>tool") == sum(1 for j in range(1, e.turns) if j % 2)

    # the training view: greedy generation picked the argmax at every policy token, so scoring the packed
    # (right-padded, images in order) episodes must find each generated token to be the argmax there
    batch = pack_episodes(tiny_processor, eps)
    tiny_student.eval()
    with torch.no_grad():
        inputs = batch.inputs
        out = tiny_student(**inputs, use_cache=False)
        logp = token_logprobs(tiny_student, batch)
    logits = out.logits[:, :-1].clone()
    logits[..., tiny_processor.vision_token_ids] = float("-inf")  # generation never writes vision tokens
    pred = logits.argmax(-1)
    target = inputs["input_ids"][:, 1:]
    m = batch.loss_mask.bool()
    assert m.sum() == sum(sum(e.loss_mask) for e in eps)
    assert torch.equal(pred[m], target[m])
    assert (logp[m] <= 0).all() and torch.isfinite(logp[m]).all()
    # turn ids on targets follow the spans
    for i, e in enumerate(eps):
        for j, (a, b) in enumerate(e.spans):
            assert (batch.turn[i, a - 1:b - 1] == j).all()


def test_sampled_episodes_are_seeded(tiny_student, tiny_processor):
    s = Sampling(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append([e.ids for e in play(tiny_student, tiny_processor, [CountdownEnv() for _ in range(2)], [2, 3], s)])
    assert runs[0] == runs[1]


def test_length_limit_truncates(tiny_student, tiny_processor):
    greedy = Sampling(do_sample=False, max_new_tokens=4)
    eps = play(tiny_student, tiny_processor, [CountdownEnv()], [50], greedy, max_tokens=60)
    assert eps[0].truncated and eps[0].done and eps[0].turns < 50


def test_current_context_makes_one_row_per_turn(tiny_student, tiny_processor):
    """context "current": each turn's prompt is its observation alone; rows carry their episode."""
    greedy = Sampling(do_sample=False, max_new_tokens=4)
    eps = play(tiny_student, tiny_processor, [CountdownEnv(), CountdownEnv()], [1, 3], greedy, context="current")
    assert [e.turns for e in eps] == [1, 3] and [len(e.texts) for e in eps] == [1, 3]
    tok = tiny_processor.tokenizer
    for e in eps:
        for j, turn in enumerate(e.per_turn):
            assert tok.decode(turn.ids).count("<|im_start|>") == 2  # one user (or tool) turn, one assistant turn
            ids, images = e.prefix(j)
            assert ids == turn.ids[:turn.spans[0][0]] and len(images) <= 1
    batch = pack_episodes(tiny_processor, eps)
    assert batch.owner.tolist() == [0, 1, 1, 1] and batch.n == 4
    assert int(batch.loss_mask.sum()) == sum(sum(t.loss_mask) for e in eps for t in e.per_turn)
    with pytest.raises(ValueError, match="expected one of"):
        play(tiny_student, tiny_processor, [CountdownEnv()], [1], greedy, context="half")


def test_an_answer_is_a_one_turn_episode_scored_as_a_packed_one(tiny_student, tiny_processor):
    """The question loop's trajectory (left-padded prompt, targets after it) and the same tokens packed as
    one-turn episodes (right-padded, targets from the second token) give each answer token the same log-prob."""
    from protege.generation.transformers_backend import sample
    from protege.rollout.episodes import pack
    from protege.rollout.trajectory import from_completions

    questions = ["What colour is the square?", "How many circles are there in the picture?"]
    images = [Image.new("RGB", (64, 64), (200, 0, 0)), Image.new("RGB", (64, 64), (0, 0, 200))]
    prompts = tiny_processor.encode_prompts(questions, images)
    c = sample(tiny_student, tiny_processor, prompts, Sampling(do_sample=True, max_new_tokens=5))
    traj = from_completions(c, tiny_processor.repeat_rows(prompts, images, 1), tiny_processor)
    P = c.prompt_len
    assert traj.start == P - 1 and traj.loss_mask.shape == (2, c.sequences.shape[1] - P)
    assert torch.equal(traj.turn, torch.where(c.completion_mask.bool(), 0, -1)) and traj.owner.tolist() == [0, 1]
    rows = []
    for i in range(2):
        keep = prompts["attention_mask"][i].bool()
        n = int(c.completion_mask[i].sum())
        prompt = c.sequences[i, :P][keep].tolist()
        ids = prompt + c.sequences[i, P:P + n].tolist()
        rows.append((ids, [0] * len(prompt) + [1] * n, [0] * len(ids), [images[i]]))
    packed = pack(tiny_processor, rows)
    with torch.no_grad():
        a, b = token_logprobs(tiny_student, traj), token_logprobs(tiny_student, packed)
    for i in range(2):
        mine, theirs = a[i][traj.loss_mask[i].bool()], b[i][packed.loss_mask[i].bool()]
        assert mine.numel() == int(c.completion_mask[i].sum()) > 0
        assert torch.allclose(mine, theirs, atol=1e-4), (i, mine, theirs)
