"""bf16 weights train through fp32 master weights: an AdamW step smaller than bf16's half-ulp still moves
the weights the updater trains (as it moves an fp32 model), the master values come back exactly on resume,
and the discriminator's head stays float32 on a bf16 backbone."""
import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from protege.runtime.state import OptimizerState, Weights, read_state, restore_state, save_state
from protege.runtime.updaters import TorchUpdater
from tests.conftest import REPO

GRAD = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0])  # exact in bf16: the same gradient either way


class Vector(nn.Module):
    def __init__(self, n: int = 8):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        """A loss whose gradient with respect to `w` is `grad` (ZeRO-3 gathers `w` inside forward only)."""
        return (self.w.float() * grad).sum()


def fraction_moved(after: torch.Tensor, before: torch.Tensor) -> float:
    return float((after != before).float().mean())


def test_one_adamw_step_at_1e5_moves_a_bf16_weight_as_the_fp32_step_does():
    """w = 1.0 (bf16's ulp below 1 is 2^-8, far above lr 1e-5): AdamW's first step is lr * g / (|g| + eps),
    so the fp32 step gives 1 - 1e-5 * sign(g). The bf16 model's master moves the same, bit for bit, and
    the model holds the master rounded to bf16 (still 1.0); plain AdamW on the bf16 weights moves nothing."""
    full, half = Vector(), Vector().to(torch.bfloat16)
    steps = {}
    for name, model in (("fp32", full), ("bf16", half)):
        updater = TorchUpdater(model, list(model.parameters()), lr=1e-5, clip=0.0)
        updater.update(model(GRAD))
        steps[name] = updater
    want = 1 - 1e-5 * torch.sign(GRAD)
    torch.testing.assert_close(full.w.detach(), want, rtol=0, atol=1e-7)
    [master] = steps["bf16"].masters
    assert master.dtype == torch.float32 and master is not half.w
    assert torch.equal(master.detach(), full.w.detach())  # the same update as the fp32 model, bit for bit
    assert half.w.dtype == torch.bfloat16
    assert torch.equal(half.w.detach(), master.detach().to(torch.bfloat16))  # the model: the master, rounded
    [own] = steps["fp32"].masters
    assert own is full.w  # fp32 parameters are stepped in place: no copy
    plain = Vector().to(torch.bfloat16)  # what the updater did before: AdamW on the bf16 weights themselves
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-5, weight_decay=0.0)
    plain(GRAD).backward()
    opt.step()
    assert torch.equal(plain.w.detach(), torch.ones(8, dtype=torch.bfloat16))


def test_micro_batch_gradients_add_up_in_fp32():
    """Two backward calls before a step: 1 + 2^-10 is a whole bf16 ulp below 1 + 2^-7, lost in a bf16 sum."""
    half = Vector(1).to(torch.bfloat16)
    updater = TorchUpdater(half, [half.w], lr=1e-5)
    updater.backward(half(torch.ones(1)))
    updater.backward(half(torch.full((1,), 2.0 ** -10)))
    assert half.w.grad is None and updater.masters[0].grad.dtype == torch.float32
    assert float(updater.masters[0].grad) == 1 + 2.0 ** -10


def test_fp32_parameters_beside_bf16_ones_are_their_own_masters():
    """A PPO value head or LoRA adapters (fp32) next to bf16 weights: only the bf16 ones get a copy."""
    half, head = Vector().to(torch.bfloat16), Vector(3)
    updater = TorchUpdater(half, [half.w, head.w], lr=1e-5, clip=1.0)
    assert updater.masters[1] is head.w and updater.masters[0].dtype == torch.float32
    updater.update(half(GRAD) + head.w.sum())
    assert (head.w.detach() < 1).all() and (updater.masters[0].detach() != 1).all()
    assert half.w.grad is None and head.w.grad is None  # cleared by the step


def _linear_runs(lr: float, steps: int = 10):
    """A small Linear trained `steps` AdamW steps from the same bf16-representable start, in fp32 and in bf16."""
    torch.manual_seed(0)
    start = nn.Linear(32, 32).to(torch.bfloat16)
    x, target = torch.randn(16, 32), torch.randn(16, 32)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = copy.deepcopy(start).to(dtype)
        updater = TorchUpdater(model, list(model.parameters()), lr=lr)
        for _ in range(steps):
            updater.update(nn.functional.mse_loss(model(x.to(dtype)).float(), target))
        out[name] = (model, updater)
    return start, out


@pytest.mark.parametrize("lr", [1e-4, 1e-5])
def test_a_bf16_linear_moves_as_many_elements_as_the_fp32_one(lr):
    """10 steps: the masters move every element the fp32 model moves; the bf16 weights themselves follow
    the fp32 run to within bf16's rounding (plain AdamW on bf16 weights rounds most updates away)."""
    start, runs = _linear_runs(lr)
    full, _ = runs["fp32"]
    half, updater = runs["bf16"]
    moved_fp32 = fraction_moved(full.weight.detach(), start.weight.float())
    assert moved_fp32 > 0.99
    assert fraction_moved(updater.masters[0].detach(), start.weight.float()) == moved_fp32
    # the bf16 weights: as often moved as the fp32 run's weights stored in bf16
    rounded = fraction_moved(full.weight.detach().to(torch.bfloat16), start.weight)
    assert abs(fraction_moved(half.weight.detach(), start.weight) - rounded) < 0.03
    # and the masters follow the fp32 run (the gradients differ by the bf16 forward's rounding only)
    near = (updater.masters[0].detach() - full.weight.detach()).abs() <= 0.2 * lr * 10
    assert float(near.float().mean()) > 0.99


def test_resume_brings_the_master_values_back_exactly(tmp_path):
    """3 steps, state saved, 2 more; a fresh updater restored from the state takes the same 2 steps and
    ends on the same masters and bf16 weights, bit for bit (re-deriving the masters from the bf16
    weights would lose what the rounding dropped)."""
    torch.manual_seed(0)
    start = nn.Linear(16, 16).to(torch.bfloat16)
    xs = [torch.randn(4, 16, dtype=torch.bfloat16) for _ in range(5)]

    def updater_of(model):
        return TorchUpdater(model, list(model.parameters()), lr=1e-5, lr_lambda=lambda i: 1.0 / (1 + i))

    def step(model, updater, x):
        updater.update(model(x).float().pow(2).mean())

    model = copy.deepcopy(start)
    updater = updater_of(model)
    for x in xs[:3]:
        step(model, updater, x)
    parts = {"model": Weights(updater), "optimizer": OptimizerState(updater)}
    save_state(tmp_path / "state", step=3, parts=parts, py_rng=random.Random(0), cursor={}, fingerprint="x")
    saved = json.loads((tmp_path / "state" / "optimizer.json").read_text())
    assert saved["masters"] == 2  # the weight's and the bias's fp32 copies
    for x in xs[3:]:
        step(model, updater, x)

    again = nn.Linear(16, 16).to(torch.bfloat16)  # other weights: the state replaces them
    resumed = updater_of(again)
    restore_state(tmp_path / "state", read_state(tmp_path / "state"),
                  parts={"model": Weights(resumed), "optimizer": OptimizerState(resumed)}, py_rng=random.Random())
    # the rounding dropped something: the bf16 weights alone would not give these masters back
    assert any(not torch.equal(m, p.detach().float()) for m, p in zip(resumed.masters, again.parameters()))
    for x in xs[3:]:
        step(again, resumed, x)
    for a, b in zip(updater.masters, resumed.masters):
        assert torch.equal(a, b)
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_an_fp32_state_holds_no_master_copies(tmp_path):
    model = nn.Linear(4, 4)
    updater = TorchUpdater(model, list(model.parameters()), lr=1e-3)
    updater.update(model(torch.ones(1, 4)).sum())
    tensors, meta = OptimizerState(updater).dump()
    assert not any(k.startswith("master.") for k in tensors) and meta.get("masters", 0) == 0


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, tiny_processor):
    from protege.config import ModelConfig
    from protege.models.student import build_student, save_student

    out = tmp_path_factory.mktemp("student")
    save_student(build_student(ModelConfig(), tiny_processor, seed=0), tiny_processor, out)
    return out


def test_the_discriminator_head_stays_float32_on_a_bf16_backbone(student_dir, tmp_path):
    """model.dtype bfloat16: bf16 backbone, fp32 head computed in fp32 (outside any autocast), kept so
    through save and load; its gradient reaches the fp32 head."""
    from protege.models.discriminator import load_discriminator

    disc = load_discriminator(student_dir, from_student=True, dtype="bfloat16")
    assert disc.head.weight.dtype == torch.float32 and disc.head.bias.dtype == torch.float32
    assert {p.dtype for p in disc.backbone.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        disc.head.weight.normal_(0, 0.1)
        disc.head.bias.fill_(1e-4)  # below bf16's half-ulp at 1.0: survives only in fp32
    ids = torch.randint(4, 60, (2, 7))
    mask = torch.ones_like(ids)
    logits = disc(input_ids=ids, attention_mask=mask)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    logits.sum().backward()
    assert disc.head.weight.grad is not None and disc.head.weight.grad.dtype == torch.float32
    disc.save(tmp_path / "disc")
    again = load_discriminator(tmp_path / "disc", dtype="bfloat16")
    assert again.head.weight.dtype == torch.float32
    assert torch.equal(again.head.weight, disc.head.weight) and torch.equal(again.head.bias, disc.head.bias)


def test_zero3_refuses_trained_parameters_of_two_dtypes():
    """ZeRO-3 flattens all trained partitions into one buffer of one dtype: a bf16 backbone with its fp32
    head is refused, naming the settings that avoid it (ZeRO-2 keeps one buffer per dtype)."""
    from protege.errors import UserFacingError
    from protege.runtime.updaters import make_updater

    body, head = Vector().to(torch.bfloat16), Vector(3)
    with pytest.raises(UserFacingError, match=r"disc_pretrain.zero_stage: 2, or model.dtype: float32"):
        make_updater("deepspeed", body, [body.w, head.w], 1e-5, 3, key="disc_pretrain.backend")


# DeepSpeed (ZeRO-2 and ZeRO-3 on the CPU) steps fp32 partitions of bf16 weights; its state must carry them


def _deepspeed_run(out: str, stage: int) -> None:
    """One process: a bf16 vector stepped at lr 1e-5 under ZeRO-`stage`; a state saved after 2 steps and
    restored into a fresh engine on other weights; both take one more step."""
    from protege.runtime.updaters import DeepSpeedUpdater

    def updater_of(model):
        return DeepSpeedUpdater(model, list(model.parameters()), lr=1e-5, zero_stage=stage, clip=0.0)

    def step(updater, k):  # a gradient that changes from step to step: the moments matter on resume
        updater.update(updater.model(GRAD * k))

    model = Vector().to(torch.bfloat16)
    updater = updater_of(model)
    step(updater, 1)
    first = [float(v) for v in torch.cat([m.detach().flatten() for m in updater.master_weights()])[:8]]
    step(updater, 2)
    folder = Path(out) / "state"
    parts = {"model": Weights(updater), "optimizer": OptimizerState(updater)}
    save_state(folder, step=2, parts=parts, py_rng=random.Random(0), cursor={}, fingerprint="x")
    step(updater, 3)
    other = Vector().to(torch.bfloat16)
    with torch.no_grad():
        other.w.fill_(0.5)
    resumed = updater_of(other)
    restore_state(folder, read_state(folder), parts={"model": Weights(resumed), "optimizer": OptimizerState(resumed)},
                  py_rng=random.Random())
    step(resumed, 3)
    with updater.gathered(), resumed.gathered():
        weights = [updater.model.w.detach().float().tolist(), resumed.model.w.detach().float().tolist()]
    (Path(out) / "result.json").write_text(json.dumps({
        "first": first, "weights": weights,
        "masters": [torch.cat([m.detach().flatten() for m in u.master_weights()]).tolist() for u in (updater, resumed)],
    }))


class BodyAndHead(nn.Module):
    """A bf16 body under an fp32 head, as the discriminator on a bf16 backbone."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.body(x.to(torch.bfloat16)).float()).sum()


def _deepspeed_mixed(out: str) -> None:
    """ZeRO-2 on a bf16 body with its fp32 head: each keeps its dtype (one flat buffer per dtype)."""
    from protege.runtime.updaters import DeepSpeedUpdater

    model = BodyAndHead()
    updater = DeepSpeedUpdater(model, list(model.parameters()), lr=1e-3, zero_stage=2)
    for _ in range(2):
        updater.update(updater.model(torch.ones(2, 8)))
    (Path(out) / "result.json").write_text(json.dumps({
        "dtypes": {k: str(v.dtype) for k, v in updater.model.state_dict().items()},
        "masters": [str(m.dtype) for m in updater.master_weights()]}))


def _launch(tmp_path, mode: str) -> dict:
    pytest.importorskip("deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "tests.unit.test_master_weights", str(tmp_path), mode],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads((tmp_path / "result.json").read_text())


def test_zero2_keeps_a_bf16_body_and_its_fp32_head_in_their_dtypes(tmp_path):
    r = _launch(tmp_path, "mixed")
    assert r["dtypes"] == {"body.weight": "torch.bfloat16", "body.bias": "torch.bfloat16",
                           "head.weight": "torch.float32", "head.bias": "torch.float32"}
    assert r["masters"] == ["torch.float32", "torch.float32"]


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_steps_fp32_partitions_of_bf16_weights_and_resumes_them(tmp_path, stage):
    r = _launch(tmp_path, str(stage))
    want = (1 - 1e-5 * torch.sign(GRAD)).tolist()
    assert r["first"] == pytest.approx(want, abs=1e-7)  # the fp32 partition moved by lr
    assert r["weights"][0] == [1.0] * 8  # the bf16 weights: the partitions rounded
    assert r["masters"][0][:8] == r["masters"][1][:8]  # resumed from the saved partitions, not the weights
    assert r["weights"][0] == r["weights"][1]


if __name__ == "__main__":
    if sys.argv[2] == "mixed":
        _deepspeed_mixed(sys.argv[1])
    else:
        _deepspeed_run(sys.argv[1], int(sys.argv[2]))
