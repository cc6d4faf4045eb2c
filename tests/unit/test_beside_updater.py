"""A module trained beside the model (PPO's value head) in the DeepSpeed engine with it (updaters.DeepSpeedUpdater's
`beside`): one optimizer and one gradient-norm clip over both, as TorchUpdater steps them; its weights saved and
restored through the updater (gathered and re-partitioned under ZeRO-3); and a weight no backward of an update
reached is stepped on a zero gradient under ZeRO-3 as under ZeRO-2, not on the previous update's gradient again.
Each DeepSpeed run is a process of its own (one rank, gloo)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import REPO

X = torch.linspace(-1, 1, 12).view(3, 4)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 1)

    def forward(self, h):
        return self.proj(h).squeeze(-1)


def models():
    torch.manual_seed(0)
    return nn.Linear(4, 4), Head()


def losses(body, head, k):
    """Update k's loss: through the body and the head (the policy term and the value loss), except update 3,
    which reaches the head alone (PPO's value warm-up after an earlier update moved the body)."""
    h = body(X * k)
    if k == 3:
        h = h.detach()
    return (head(h) - k).pow(2).mean() + (0.0 if k == 3 else h.pow(2).mean())


def train(updater, body, head, ks):
    for k in ks:
        updater.update(losses(body, head, k))


def flat(body, head):
    return torch.cat([p.detach().flatten() for p in [*body.parameters(), *head.parameters()]]).tolist()


def _run(out: str, stage: int) -> None:
    from protege.runtime.run import Run
    from protege.runtime.state import OptimizerState, Weights
    from protege.runtime.updaters import DeepSpeedUpdater

    def updater_of(body, head):
        return DeepSpeedUpdater(body, [*body.parameters(), *head.parameters()], lr=1e-2, zero_stage=stage,
                                clip=0.05, beside={"value_head": head})

    def parts(u, head):
        return {"policy": Weights(u), "value_head": Weights(u.weights_of(head)), "optimizer": OptimizerState(u)}

    body, head = models()
    updater = updater_of(body, head)
    train(updater, body, head, [1, 2])
    Run(Path(out) / "state", parts(updater, head), random.Random(0), "x", 4).save(2, {})
    train(updater, body, head, [3, 4])
    with updater.gathered():
        whole = flat(body, head)
    other_body, other_head = nn.Linear(4, 4), Head()  # other weights: the state brings them back
    resumed = updater_of(other_body, other_head)
    start, _ = Run(Path(out) / "state", parts(resumed, other_head), random.Random(0), "x", 4).resume()
    train(resumed, other_body, other_head, [3, 4])
    with resumed.gathered():
        again = flat(other_body, other_head)
    (Path(out) / f"result-{stage}.json").write_text(json.dumps({"whole": whole, "again": again, "start": start,
                                                                 "policy": sorted(updater.model.state_dict())}))


def _launch(tmp_path, *args: str) -> None:
    pytest.importorskip("deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "tests.unit.test_beside_updater", str(tmp_path), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _result(tmp_path, stage: int) -> dict:
    _launch(tmp_path, str(stage))
    return json.loads((tmp_path / f"result-{stage}.json").read_text())


@pytest.mark.parametrize("stage", [2, 3])
def test_the_head_trains_in_the_engine_and_resumes_exactly(tmp_path, stage):
    r = _result(tmp_path, stage)
    assert r["start"] == 3 and r["again"] == r["whole"]  # restored from the state, weights and head alike
    assert r["policy"] == ["bias", "weight"]  # the model's own state: the head is not in it


def test_zero3_steps_what_no_backward_reached_as_zero2_does(tmp_path):
    z2, z3 = _result(tmp_path, 2), _result(tmp_path, 3)
    torch.testing.assert_close(torch.tensor(z3["whole"]), torch.tensor(z2["whole"]), rtol=0, atol=1e-6)


def test_one_clip_over_the_model_and_the_head(tmp_path):
    """Two updates, clipped (their norms are far above 0.05), under ZeRO-2 move the model and the head as
    TorchUpdater moves them: one optimizer and one clip over both."""
    from protege.runtime.updaters import TorchUpdater

    body, head = models()
    updater = TorchUpdater(body, [*body.parameters(), *head.parameters()], lr=1e-2, clip=0.05)
    # torch's AdamW skips a parameter without a gradient (update 3's body) where ZeRO steps it on zero, which
    # moves it by its moments: the comparison stops before update 3
    train(updater, body, head, [1, 2])
    _launch(tmp_path, "2", "--two")
    ds = json.loads((tmp_path / "two.json").read_text())
    torch.testing.assert_close(torch.tensor(ds), torch.tensor(flat(body, head)), rtol=0, atol=1e-6)


def _two(out: str) -> None:
    from protege.runtime.updaters import DeepSpeedUpdater

    body, head = models()
    updater = DeepSpeedUpdater(body, [*body.parameters(), *head.parameters()], lr=1e-2, zero_stage=2, clip=0.05,
                               beside={"value_head": head})
    train(updater, body, head, [1, 2])
    (Path(out) / "two.json").write_text(json.dumps(flat(body, head)))


if __name__ == "__main__":
    if sys.argv[3:] == ["--two"]:
        _two(sys.argv[1])
    else:
        _run(sys.argv[1], int(sys.argv[2]))
