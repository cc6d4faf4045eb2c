"""An RL run's output folder across restarts: kept when its saved state continues this run, set aside
(until the new run saves its first state) when the params changed, so a kill never loses a finished run."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from protege.runtime.state import read_state, recover_state


def resumable(meta: dict | None, fp: str, steps: int) -> bool:
    """A saved state continues this run: same fingerprint, and no further than the steps asked for."""
    return meta is not None and meta["fingerprint"] == fp and meta["step"] <= steps


STATE = "state"


def previous_dir(out: Path) -> Path:
    return out.with_name(out.name + ".previous")


def prepare_out_dir(out: Path, fp: str, steps: int) -> int:
    """Keeps a resumable run's folder (returns its step), or starts a fresh one (returns 0).

    The same run asked for more steps is resumable (see `resumable`). A run whose params really changed
    does not delete the old one's checkpoints yet: they move to `<out>.previous`, which is removed once
    the new run has saved its first state (`drop_previous`); until then a kill loses nothing."""
    if out.exists():
        recover_state(out / STATE)
    meta = read_state(out / STATE) if out.exists() else None
    previous = previous_dir(out)
    if not resumable(meta, fp, steps) and meta is None and previous.exists():
        recover_state(previous / STATE)
        if resumable(read_state(previous / STATE), fp, steps):
            # back to the params of the run set aside, before the other run saved a state: take it back
            if out.exists():
                shutil.rmtree(out)
            os.replace(previous, out)
            meta = read_state(out / STATE)
    if not resumable(meta, fp, steps):
        if out.exists():
            if meta is not None:  # a run with a state: keep it aside until the new one has its own
                if previous.exists():
                    shutil.rmtree(previous)
                os.replace(out, previous)
            else:  # a fresh run killed before its first state: nothing in it to keep
                shutil.rmtree(out)
        out.mkdir(parents=True)
        return 0
    for ckpt in out.glob("step-*"):  # written after the last state save: will be written again
        if int(ckpt.name.split("-")[1]) > meta["step"]:
            shutil.rmtree(ckpt)
    return meta["step"]


def drop_previous(out: Path) -> None:
    if previous_dir(out).exists():
        shutil.rmtree(previous_dir(out))


