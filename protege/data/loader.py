"""Images decoded batch by batch, a few batches ahead of the loop that uses them.

Rows hold image paths (protege.data.rows); a loop over many rows hands `decoded_batches` the index lists of
its batches, in the order it will use them, and gets each batch's decoded images back in that order. With
`data.workers` processes the next batches decode while the model works on the current one; without, they
decode in the loop's own process. Either way a batch holds exactly the pixels `Row.image` gives, so results
do not depend on the setting, and memory holds a few batches of images, never the table's.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence

import torch.utils.data

from protege.data.rows import ImageSource, decoded
from protege.errors import UserFacingError

PREFETCH = 2  # batches each worker decodes ahead: enough to hide a slow batch, few enough to bound memory


def local_ranks() -> tuple[int, int]:
    """(this process's index among the ranks on its machine, how many ranks run on it); (0, 1) unlaunched."""
    size = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    rank = os.environ.get("LOCAL_RANK")
    return (int(rank) if rank is not None else int(os.environ.get("RANK", 0)) % size), size


def workers_of_rank(workers: int) -> int:
    """This rank's share of `data.workers`, a number per machine: under N ranks each starts its own decoders,
    so the machine's cores are split between them as its threads are (the first ranks take the remainder; a
    rank whose share is 0 decodes in its own process)."""
    index, size = local_ranks()
    return workers // size + (1 if index < workers % size else 0)


class _Failed:
    """A decoding error caught in a worker, raised again by the loop: DataLoader would wrap the exception in
    its own message and traceback, and the user needs only which file of which row could not be read."""

    def __init__(self, message: str):
        self.message = message


class _Decode(torch.utils.data.Dataset):
    """Decodes what the plan hands each worker: (index, image source) pairs. It holds nothing itself, so
    starting a worker copies no table, whatever the start method."""

    def __getitem__(self, item: tuple[int, ImageSource]):
        index, source = item
        try:
            return index, decoded(source)
        except UserFacingError as exc:
            return index, _Failed(str(exc))


def _collate(items: list) -> tuple[list[int], list]:
    return [i for i, _ in items], [im for _, im in items]


class _Plan:
    """The batches, as (index, source) pairs: iterated in the loop's process, a few batches ahead of it."""

    def __init__(self, sources: Sequence[ImageSource], batches: Iterable[Sequence[int]]):
        self.sources, self.batches = sources, batches

    def __iter__(self):
        for batch in self.batches:
            yield [(i, self.sources[i]) for i in batch]


def _checked(images: list) -> list:
    for im in images:
        if isinstance(im, _Failed):
            raise UserFacingError(im.message)
    return images


def decoded_batches(sources: Sequence[ImageSource], batches: Iterable[Sequence[int]],
                    workers: int = 0) -> Iterator[tuple[list[int], list]]:
    """(the batch's indices, their decoded images) for each index list of `batches`, in order. `sources[i]` is
    row i's `Row.source` (or any ImageSource). `workers`: this process's decoding processes (workers_of_rank);
    0 decodes each batch when the loop asks for it. A file that does not decode raises UserFacingError naming
    the table, the row and the file."""
    if workers <= 0:
        for batch in batches:
            yield list(batch), [decoded(sources[i]) for i in batch]
        return
    # its own generator: DataLoader draws its workers' seed from the global one otherwise, and sampling and
    # training read that stream (a saved state restores it) the same whatever `workers` is
    loader = torch.utils.data.DataLoader(_Decode(), batch_sampler=_Plan(sources, batches), num_workers=workers,
                                         prefetch_factor=PREFETCH, collate_fn=_collate,
                                         generator=torch.Generator().manual_seed(0))
    for indices, images in loader:
        yield indices, _checked(images)


def consecutive(n: int, batch_size: int) -> Iterator[list[int]]:
    """0..n-1 in batches of `batch_size`, as a loop that walks a table in order takes them."""
    for start in range(0, n, batch_size):
        yield list(range(start, min(start + batch_size, n)))


def row_sources(rows: Sequence) -> list[ImageSource]:
    """Each row's `source` (its image files, or images in memory): what `decoded_batches` decodes."""
    return [r.source for r in rows]


def image_batches(rows: Sequence, batch_size: int, workers: int = 0) -> Iterator[list]:
    """The decoded images of `rows` in consecutive batches of `batch_size`, in order (generate_answers,
    answer_logprobs)."""
    for _, images in decoded_batches(row_sources(rows), consecutive(len(rows), batch_size), workers):
        yield images
