"""SFT and discriminator pretraining on the shared training runtime: the loss over a global batch split
across processes, 2-process DeepSpeed (CPU, gloo) against one process, and exact resume."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from protege.config import DiscPretrainConfig, ModelConfig
from protege.data.rows import load_rows
from protege.models.discriminator import Discriminator
from protege.models.student import build_student, load_student, save_student
from protege.train.disc_pretrain import pretrain_discriminator
from protege.runtime.distributed import global_mean_share
from protege.train.sft import answer_loss, answer_tokens
from tests.conftest import REPO
from tests.stages import sft_worker


@pytest.fixture(scope="module")
def base(tiny_processor, tmp_path_factory):
    """The untrained tiny student on disk: every process of a run starts from these very weights."""
    path = tmp_path_factory.mktemp("base")
    save_student(build_student(ModelConfig(), tiny_processor, seed=0), tiny_processor, path)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world_size: int, *args: str) -> None:
    """`world_size` processes of sft_worker with the environment torchrun would give them."""
    pytest.importorskip("deepspeed")
    port = str(_free_port())
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, DS_ACCELERATOR="cpu", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.stages.sft_worker", *args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]


def test_sharded_answer_loss_is_the_mean_over_every_answer_token(tiny_student, tiny_processor, tiny_world):
    """Two slices of a 6-row batch, as two ranks hold them: averaging their shares (DeepSpeed averages
    gradients) gives the token mean of the whole batch, computed here by hand from the logits, and its
    gradient; a mean of the two slices' means would not."""
    table = load_rows(tiny_world / "train.parquet")

    def encode(rs):
        return tiny_processor.encode_pairs([r.question for r in rs], [r.image for r in rs], [r.answer for r in rs])

    # the first 6 rows whose two slices hold different numbers of answer tokens: with equal counts a mean of
    # means would equal the token mean and prove nothing
    for start in range(0, len(table) - 5):
        rows = table[start:start + 6]
        slices = [encode(rows[0::2]), encode(rows[1::2])]
        counts = [answer_tokens(b) for b in slices]
        if counts[0] != counts[1]:
            break
    assert counts[0] != counts[1], "no 6 rows of the world split their answer tokens unevenly"
    full = encode(rows)

    # by hand: position t predicts token t + 1; only answer tokens are targets
    inputs = {k: v for k, v in full.items() if k != "answer_mask"}
    logp = torch.log_softmax(tiny_student(**inputs).logits.float(), dim=-1)[:, :-1]
    targets, keep = full["input_ids"][:, 1:], full["answer_mask"][:, 1:] == 1
    token_nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[keep]
    assert token_nll.numel() == sum(counts) == answer_tokens(full)
    by_hand = token_nll.sum() / token_nll.numel()

    shares = [global_mean_share(answer_loss(tiny_student, b), n, sum(counts), 2) for b, n in zip(slices, counts)]
    averaged = (shares[0] + shares[1]) / 2
    torch.testing.assert_close(averaged, by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(answer_loss(tiny_student, full), by_hand, rtol=0, atol=1e-6)
    means = [answer_loss(tiny_student, b) for b in slices]
    assert abs(((means[0] + means[1]) / 2 - by_hand).item()) > 1e-3

    params = [p for p in tiny_student.parameters() if p.requires_grad]
    got = torch.autograd.grad(averaged, params, allow_unused=True)
    want = torch.autograd.grad(answer_loss(tiny_student, full), params, allow_unused=True)
    for g, w in zip(got, want):
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)


def test_two_deepspeed_processes_match_one_process(base, tiny_world, tmp_path, record_property):
    """The same 4 SFT steps (warm-up + cosine, batch 6 -> 3 rows per rank) and 2 discriminator steps: 2 ZeRO-2
    processes on gloo against one plain-torch process.

    Tolerances: the processes sum each gradient in another order, so float32 rounding differs (~1e-7
    relative). Losses: ~1 ulp of a loss near 6 is 4.8e-7, atol 1e-5. Weights: AdamW moves a weight by at most
    about lr (2e-3 here) per step whatever the gradient's size, and rounding noise in a gradient moves that
    step by a tiny fraction of it; atol 1e-4 is 5% of one step's largest move and ~25x what was measured
    (2.4e-6 SFT, 4.9e-6 discriminator), while a mean of per-rank means instead of the token mean changes the
    very first loss by more than 1e-3."""
    one = sft_worker.run(base, tiny_world, tmp_path, "one", "torch")
    launch(2, str(base), str(tiny_world), str(tmp_path), "--tag", "two", "--backend", "deepspeed")
    ranks = [json.loads((tmp_path / f"two-rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["logs"] == ranks[1]["logs"]  # every rank logs the global batch's loss
    two = ranks[0]
    for stage, steps in (("sft", 4), ("disc", 2)):
        want, got = one["logs"][stage], two["logs"][stage]
        assert [s for s, _ in got] == [s for s, _ in want] == list(range(1, steps + 1))
        diff = max(abs(a - b) for (_, a), (_, b) in zip(want, got))
        record_property(f"{stage}_max_loss_diff", diff)
        print(f"{stage}: max |loss(2 processes) - loss(1 process)| = {diff:.3g}")
        assert diff <= 1e-5, (want, got)
        w1, w2 = load_file(str(tmp_path / f"one-{stage}.safetensors")), load_file(str(tmp_path / f"two-{stage}.safetensors"))
        assert sorted(w1) == sorted(w2)
        weight_diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        record_property(f"{stage}_max_weight_diff", weight_diff)
        print(f"{stage}: max |weight(2 processes) - weight(1 process)| = {weight_diff:.3g}")
        for k in w1:
            torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=1e-4)
    start, trained = load_student(base)[0].state_dict(), load_file(str(tmp_path / "two-sft.safetensors"))
    assert sorted(start) == sorted(trained) and sum(not torch.equal(start[k], trained[k]) for k in start) > len(start) // 2


def _check_resume(report: dict, out) -> None:
    whole, stopped, resumed = report["whole"], report["stopped"], report["resumed"]
    assert stopped["resumed_after_step"] == 0 and resumed["resumed_after_step"] == 2
    assert len({loss for _, loss in whole["logs"]["sft"]}) == 4  # it trains: every step's loss differs
    assert [s for s, _ in resumed["logs"]["sft"]] == [3, 4]  # steps 3 and 4 again, from the state of step 2
    assert resumed["logs"]["sft"] == whole["logs"]["sft"][2:]  # the same losses, bit for bit
    a, b = load_file(str(out / "whole-sft.safetensors")), load_file(str(out / "cut-sft.safetensors"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    state = out / "cut-state"
    meta = json.loads((state / "state.json").read_text())
    assert meta["step"] == 4
    optimizer = json.loads(next(state.glob("optimizer*.json")).read_text())
    assert optimizer["scheduler"]["last_epoch"] == 4  # the LR schedule is part of the state


def test_sft_resume_is_bitwise_torch(base, tiny_world, tmp_path):
    _check_resume(sft_worker.resume_scenario(base, tiny_world, tmp_path, "torch"), tmp_path)


def test_sft_resume_is_bitwise_deepspeed(base, tiny_world, tmp_path):
    """ZeRO-2, one process: the flat fp32 partition of the moments and the LR schedule on DeepSpeed's
    optimizer come back from our files."""
    launch(1, str(base), str(tiny_world), str(tmp_path), "--backend", "deepspeed", "--resume-scenario")
    _check_resume(json.loads((tmp_path / "resume.json").read_text()), tmp_path)


def test_disc_pretrain_resumes_bitwise(base, tiny_processor, tiny_world, tmp_path):
    rows = load_rows(tiny_world / "train.parquet")
    cfg = DiscPretrainConfig(**{**sft_worker.DISC, "steps": 3}, device="cpu")

    def train(state=None, stop_after=None):
        torch.manual_seed(1)
        disc = Discriminator(load_student(base)[0].model)
        logs = []
        pretrain_discriminator(disc, tiny_processor, sft_worker.examples(rows), cfg, seed=0,
                               on_log=lambda s, m: logs.append((s, m["loss"])), state_dir=state, stop_after=stop_after)
        return disc.state_dict(), logs

    whole, whole_logs = train()
    train(tmp_path / "state", stop_after=2)
    resumed, resumed_logs = train(tmp_path / "state")
    assert [s for s, _ in resumed_logs] == [3] and resumed_logs == whole_logs[2:]
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    assert not torch.equal(whole["head.weight"], torch.zeros_like(whole["head.weight"]))  # it trained


def test_torch_backend_refuses_several_processes(base, tiny_world, tmp_path, monkeypatch):
    from protege.errors import UserFacingError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserFacingError, match="sft.backend 'torch' trains in one process.*sft.backend: deepspeed"):
        sft_worker.run(base, tiny_world, tmp_path, "x", "torch", disc=False)
