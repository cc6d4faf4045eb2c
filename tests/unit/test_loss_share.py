"""The per-rank share of a loss that is a mean over the whole global batch (protege/runtime)."""
import pytest
import torch

from protege.runtime.distributed import global_mean_share


def test_shares_average_to_the_mean_over_every_token_of_the_global_batch():
    # rank 0 holds two answer tokens with losses 1 and 3 (mean 2), rank 1 one token with loss 5: the global
    # batch's token mean is (1 + 3 + 5) / 3 = 3
    share0 = global_mean_share(torch.tensor(2.0), local_count=2, global_count=3, world_size=2)
    share1 = global_mean_share(torch.tensor(5.0), local_count=1, global_count=3, world_size=2)
    assert share0.item() == pytest.approx(8 / 3)   # (1 + 3) / 3 * 2
    assert share1.item() == pytest.approx(10 / 3)  # 5 / 3 * 2
    assert ((share0 + share1) / 2).item() == pytest.approx(3.0)  # what averaging gradients over ranks sees
    # a mean of the ranks' means would weigh rank 1's one token like rank 0's two: (2 + 5) / 2 = 3.5


def test_gradient_of_the_shares_is_the_gradient_of_the_global_mean():
    x = torch.tensor([1.0, 3.0, 5.0], requires_grad=True)  # one parameter per token: d(mean)/dx_i = 1/3
    shares = [global_mean_share(x[:2].mean(), 2, 3, 2), global_mean_share(x[2:].mean(), 1, 3, 2)]
    ((shares[0] + shares[1]) / 2).backward()
    assert torch.allclose(x.grad, torch.full((3,), 1 / 3))


def test_one_process_is_bitwise_the_plain_mean():
    mean = torch.tensor(0.1234567)
    assert torch.equal(global_mean_share(mean, 7, 7, 1), mean)


def test_an_empty_slice_is_an_error():
    with pytest.raises(ValueError, match="needs items on this rank"):
        global_mean_share(torch.tensor(1.0), 0, 3, 2)
