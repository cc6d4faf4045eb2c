"""Under ZeRO-3 every forward gathers weights (a collective): the ranks agree on how many micro-batches each
runs, a rank with fewer length groups splitting its largest; one with fewer rows than that is refused on
every rank alike. Two real processes over gloo."""
import os
import socket

import torch.multiprocessing as mp

from protege.runtime.micro import length_groups, rank_length_groups, split_to


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, lengths: list[list[int]], tokens: int, out):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out.put((rank, rank_length_groups(lengths[rank], tokens, agree=True)))
    except Exception as exc:  # noqa: BLE001 - what each rank saw goes back to the test
        out.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def run_two(lengths: list[list[int]], tokens: int) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, port, lengths, tokens, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return got


def test_ranks_run_as_many_forwards():
    # rank 0: eight rows of two lengths (two groups by length); rank 1: eight rows of one length (one group)
    lengths = [[10] * 4 + [200] * 4, [50] * 8]
    assert len(length_groups(lengths[0], 800)) > len(length_groups(lengths[1], 800))
    got = run_two(lengths, 800)
    assert len(got[0]) == len(got[1]) == len(length_groups(lengths[0], 800))
    for rank in (0, 1):  # every row once
        assert sorted(i for g in got[rank] for i in g) == list(range(8))


def test_a_rank_with_fewer_rows_than_forwards_is_refused_on_both():
    got = run_two([[10, 400, 10, 400], [50]], 400)
    assert all(isinstance(v, str) and "DeepSpeed runs as many forwards" in v for v in got.values()), got


def test_split_to_halves_the_most_padded_group():
    lengths = [5, 5, 100, 100, 100, 100]
    groups = split_to([[0, 1], [2, 3, 4, 5]], lengths, 3)
    assert sorted(map(sorted, groups)) == [[0, 1], [2, 3], [4, 5]]
    assert split_to([[0]], [5], 3) == [[0]]  # nothing left to split


def test_without_agreement_nothing_is_exchanged():
    assert rank_length_groups([1, 2, 3], 100, False) == length_groups([1, 2, 3], 100)
