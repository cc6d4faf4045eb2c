"""PPO and GTR-Turbo's guidance on several ranks, piece by piece: three real gloo processes on an uneven split
of one batch (4/2/2 episodes: two per layout) take the value loss's gradient, GAE's batch normalisation and the
SFT guidance's choice of contexts that one process takes of the whole batch. The whole loop on two DeepSpeed
ranks: tests/stages/test_agent_deepspeed.py."""
import json
import os
import random
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from protege.config import AgentConfig, AgentRLConfig

HIDDEN = 8
E, T = 8, 3                                                   # episodes, turns
G = 2                                                         # episodes per layout (group)
TURNS = [3, 1, 2, 3, 2, 2, 1, 3]                              # each episode's turns


def batch():
    """Hidden states at each turn's start, value targets, V at play time and the valid turns of E episodes."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(E, T, HIDDEN, generator=g)
    targets = torch.randn(E, T, generator=g) * 3
    old = torch.randn(E, T, generator=g) * 0.05
    valid = torch.arange(T).unsqueeze(0) < torch.tensor(TURNS).unsqueeze(1)
    return hidden, targets, old, valid


def value_gradient(episodes: list[int]) -> torch.Tensor:
    """This process's value-loss gradient on `episodes`, the loss divided as PPOWithValueHead.prepare divides it."""
    from protege.rl.ppo import ValueHead, value_loss
    from protege.runtime.distributed import per_rank

    hidden, targets, old, valid = (t[episodes] for t in batch())
    torch.manual_seed(0)
    head = ValueHead(HIDDEN)
    torch.nn.init.normal_(head.proj.weight, std=0.3)
    loss = value_loss(head(hidden), targets, valid, turns=per_rank(float(valid.sum())), old=old, clip=0.1)
    loss.backward()
    return torch.cat([head.proj.weight.grad.flatten(), head.proj.bias.grad])


def normalised(episodes: list[int]) -> torch.Tensor:
    from protege.rl.estimators import gae
    from protege.rl.estimators.base import Returns

    _, targets, old, valid = (t[episodes] for t in batch())
    returns = Returns(targets * valid, valid, G, values=old)
    return gae.estimate(returns, AgentRLConfig(algorithm="ppo"))  # [e, T]


def picks(episodes: list[int], index: list[int] | None) -> tuple[list, tuple]:
    """The SFT guidance's contexts among `episodes` (as whole-batch indices) and the random generator after."""
    from protege.rl.guidance.merged_teacher import picked_turns

    rng = random.Random(5)
    eps = [SimpleNamespace(turns=TURNS[i]) for i in episodes]
    mine = picked_turns(eps, 5, rng, index)
    return [(episodes[i], j) for i, j in mine], rng.getstate()


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    from protege.rl.rollouts.episodes import whole_batch_index

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        index = whole_batch_index(len(range(rank, E // G, world)) * G, G, rank, world)  # the loop's split: 4/2/2
        grad = value_gradient(index)
        torch.distributed.all_reduce(grad)
        picked, state = picks(index, index)
        every = [None] * world
        torch.distributed.all_gather_object(every, picked)
        result = {"grad": (grad / world).tolist(), "index": index, "adv": normalised(index).tolist(),
                  "picked": sorted(p for mine in every for p in mine), "rng": list(state[1])}
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(var, None)
    tmp = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank, args=(3, str(tmp / "init"), str(tmp / "out")), nprocs=3, join=True)
    return [json.loads((tmp / f"out.{r}").read_text()) for r in range(3)]


def test_the_split_covers_the_batch_in_one_process_order(three_ranks):
    from protege.rl.rollouts.episodes import whole_batch_index

    assert [r["index"] for r in three_ranks] == [[0, 1, 6, 7], [2, 3], [4, 5]]
    assert whole_batch_index(4, 2, 0, 1) == [0, 1, 2, 3]


def test_value_loss_gradient_over_ranks_is_one_process_gradient(three_ranks):
    one = value_gradient(list(range(E)))
    three = torch.tensor(three_ranks[0]["grad"])
    assert one.abs().sum() > 0
    torch.testing.assert_close(three, one, rtol=1e-5, atol=1e-7)
    # each rank's mean over its own turns, averaged over the ranks, is another gradient
    from protege.rl.ppo import ValueHead, value_loss

    def own_mean(r):
        hidden, targets, old, valid = (t[three_ranks[r]["index"]] for t in batch())
        torch.manual_seed(0)
        head = ValueHead(HIDDEN)
        torch.nn.init.normal_(head.proj.weight, std=0.3)
        value_loss(head(hidden), targets, valid, old=old, clip=0.1).backward()
        return torch.cat([head.proj.weight.grad.flatten(), head.proj.bias.grad])

    assert (sum(own_mean(r) for r in range(3)) / 3 - one).abs().max() > 100 * (three - one).abs().max()


def test_gae_normalises_over_every_ranks_turns(three_ranks):
    one = normalised(list(range(E)))
    for r in three_ranks:
        torch.testing.assert_close(torch.tensor(r["adv"]), one[r["index"]], rtol=1e-5, atol=1e-6)


def test_sft_contexts_are_drawn_from_the_whole_step(three_ranks):
    """Every rank draws what one process draws of the whole step and answers its own share of it; the random
    generators stay as one (the next step's layouts are drawn from it on every rank)."""
    one, state = picks(list(range(E)), None)
    assert three_ranks[0]["picked"] == sorted(list(p) for p in one) and len(one) == 5
    assert all(r["rng"] == list(state[1]) for r in three_ranks)


def test_ppo_runs_under_deepspeed():
    """The agent section's default (PPO with GTR-Turbo's KL guidance) validates on the DeepSpeed backend."""
    cfg = AgentConfig.model_validate({"rl": {"backend": "deepspeed", "zero_stage": 3}})
    assert cfg.rl.algorithm == "ppo" and cfg.rl.backend == "deepspeed"
    assert AgentRLConfig(algorithm="ppo", backend="deepspeed").backend == "deepspeed"
