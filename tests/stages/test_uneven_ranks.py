"""8 questions on 3 ranks (3/3/2): the question loop's policy update, with the ranks' gradients averaged as
DeepSpeed averages them, is the gradient one process takes of all 8. Three real gloo processes run the clipped
surrogate's micro-batch losses (`UpdateBatch.of` sets the loss's row normaliser) on their share of the same batch
through the tiny student."""
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from protege.config import RLConfig

QUESTIONS = [f"How many {c} shapes are there?" for c in ("red", "blue", "green", "yellow")] * 2
ANSWERS = ["3", "two", "It is 5.", "one shape", "4", "there are six", "1", "7 shapes"]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, 0.5, -0.25, -0.75])  # [8] one per answer row


def _gradient(student_dir: str, algorithm: str, rows: list[int]) -> torch.Tensor:
    """The flat gradient of this process's share of the policy loss of `rows` (two micro-batches)."""
    from protege.models.student import load_student
    from protege.rl.objectives.base import Advantage, UpdateBatch
    from protege.rl.objectives.clipped import ClippedSurrogate
    from protege.rl.sample import Sample
    from protege.rollout.trajectory import answer_trajectory

    torch.manual_seed(0)
    policy, processor = load_student(student_dir)
    whole = answer_trajectory(processor.encode_pairs(QUESTIONS, [None] * 8, ANSWERS), [[] for _ in range(8)])
    traj = whole.select(rows, processor)
    half = (traj.n + 1) // 2
    parts = [traj.select(range(half), processor), traj.select(range(half, traj.n), processor)]

    cfg = RLConfig(algorithm=algorithm, kl_beta=0.04)
    sample = Sample(traj, parts, [slice(0, half), slice(half, traj.n)], traj.loss_mask.float(), max_len=8)
    batch = UpdateBatch.of(sample, None, None, Advantage(ADVANTAGES[rows], ADVANTAGES[rows]), [None, None])
    objective = ClippedSurrogate(cfg, policy, torch.device("cpu"))
    for i in range(len(parts)):  # what the updaters do with a share: add its gradient (the step is the test's)
        objective.loss(policy, i, batch)[0].backward()
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel())
                      for p in policy.parameters()])


def _rank(rank: int, world: int, init_file: str, student_dir: str, algorithm: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        grad = _gradient(student_dir, algorithm, list(range(8))[rank::world])  # the loop's split: 3/3/2
        torch.distributed.all_reduce(grad)
        if rank == 0:
            save_file({"grad": grad / world}, out)  # DeepSpeed's average over ranks
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, tiny_processor):
    from protege.config import ModelConfig
    from protege.models.student import build_student, save_student

    out = tmp_path_factory.mktemp("student")
    save_student(build_student(ModelConfig(), tiny_processor, seed=0), tiny_processor, out)
    return str(out)


@pytest.mark.parametrize("algorithm", ["dr_grpo", "grpo"])
def test_three_uneven_ranks_take_one_process_gradient(student_dir, algorithm, tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    one = _gradient(student_dir, algorithm, list(range(8)))
    out = tmp_path / "grad.safetensors"
    mp.spawn(_rank, args=(3, str(tmp_path / "init"), student_dir, algorithm, str(out)), nprocs=3, join=True)
    three = load_file(out)["grad"]
    assert one.abs().sum() > 0
    torch.testing.assert_close(three, one, rtol=1e-4, atol=1e-7)
    # what dividing by a rank's own rows gives instead (a mean of the ranks' means): visibly another gradient
    by_own_rows = sum(_gradient(student_dir, algorithm, list(range(8))[r::3]) * (8 / 3) / len(range(8)[r::3])
                      for r in range(3)) / 3
    assert (by_own_rows - one).abs().max() > 100 * (three - one).abs().max()
