"""The skeleton every trainer shares (sft, agent_sft, disc_pretrain and the RL loops): resuming from the
training state, the epoch-wise order of the data and the save cadence. A trainer keeps only its step body; with the same seed and settings it draws its random numbers in the same order
whether it starts afresh or resumes, so a resumed run ends with bitwise the weights of an uninterrupted one.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from protege.runtime.run_folder import resumable
from protege.runtime.state import Part, prepare_state, restore_state, save_state


def next_rows(order: list[int], n_rows: int, n: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """The next n of n_rows row indices, every row once per epoch (reshuffled when fewer than n are left);
    returns (the batch, what is left of the order)."""
    if len(order) < n:
        fresh = list(range(n_rows))
        rng.shuffle(fresh)
        order = order + fresh
    return order[:n], order[n:]


def due(step: int, every: int, last: int) -> bool:
    """Whether a periodic action (log, save, evaluate) happens after `step`: every `every` steps and the last."""
    return step % every == 0 or step == last


class Run:
    """A run's resumable state: `parts` (weights, optimizer, RNG, ... by file name), the python RNG and a
    cursor of the trainer's own (data order, running losses). A state continues this run when its
    fingerprint matches and it is no further than `steps`: a longer run of a constant learning rate
    continues a finished shorter one (the fingerprint leaves `steps` out there). Without a folder, nothing
    is saved or resumed. Under several processes every rank calls `resume` and `save` (collective)."""

    def __init__(self, folder: Path | None, parts: dict[str, Part], rng: random.Random, fingerprint: str, steps: int,
                 *, rank: int = 0, world_size: int = 1, barrier: Callable[[], None] = lambda: None,
                 on_saved: Callable[[int], None] | None = None):
        self.folder, self.parts, self.rng, self.fingerprint, self.steps = folder, parts, rng, fingerprint, steps
        self.rank, self.world_size, self.barrier, self.on_saved = rank, world_size, barrier, on_saved

    def resume(self) -> tuple[int, dict]:
        """(the first step to run, the saved cursor); (1, {}) for a fresh run."""
        if self.folder is None:
            return 1, {}
        meta = prepare_state(self.folder, self.fingerprint, self.rank, self.barrier)
        if not resumable(meta, self.fingerprint, self.steps):
            return 1, {}
        restore_state(self.folder, meta, parts=self.parts, py_rng=self.rng, rank=self.rank)
        return meta["step"] + 1, meta["cursor"]

    def save(self, step: int, cursor: dict) -> None:
        if self.folder is None:
            return
        save_state(self.folder, step=step, parts=self.parts, py_rng=self.rng, cursor=cursor,
                   fingerprint=self.fingerprint, rank=self.rank, world_size=self.world_size, barrier=self.barrier)
        if self.on_saved is not None and self.rank == 0:
            self.on_saved(step)
