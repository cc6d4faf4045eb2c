"""data: your own files (`data.source: files`) as the question tables every later stage reads.

Each split (`data.train`, `data.rl`, `data.val`, `data.test`: a file, a folder or a list of them) is read as
it comes (protege.data.layouts: LLaVA conversations, flat JSON / JSONL records, parquet tables such as
Hugging Face exports or verl / EasyR1 RL tables), its images stored once by content under
data/imported/images/, and checked by the same Great Expectations suite as `protege data import`. Every file
is read and checked before anything is written: a missing or empty split, an unknown layout, a mapped
column a file lacks, an RL / val / test question without an answer and a question id in two splits stop
the stage naming the file and row. The new tables replace the last good import only once every split has
passed, so a bad file loses nothing already imported (dvc.yaml keeps the folder between runs).

Files are read as they go, a batch of records at a time, with a progress line every few seconds; the images
already checked when a split fails wait in data/.imported-import-cache/ for the next run, which reads again
only new or changed ones (protege.data.importers). With `data.images_in_place` the tables name your image
files where they are instead of copies under data/imported/images/ (see protege.data.importers for why the
default copies).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from protege.config import Config
from protege.data.importers import (ImageStore, cache_folder, file_rows, parquet_rows, progress_done, stage_split,
                                    write_table)
from protege.data.layouts import dataset_files
from protege.data.validate import DatasetInvalid
from protege.errors import UserFacingError
from protege.paths import IMPORTED, SPLITS
from protege.pool import ensure_pool
from protege.progress import Progress
from protege.stages.common import say, write_stage_metrics

ANSWER_NEEDED = ("rl", "val", "test")  # the judge compares with it; SFT can train on the target alone


def resolve(root: Path, entry: str) -> Path:
    path = Path(entry).expanduser()
    return path if path.is_absolute() else root / path


def read_split(cfg: Config, root: Path, split: str, entries: list[str], store: ImageStore) -> pd.DataFrame:
    """A split's rows from all its files (column `file`: the row's file), their images checked into `store`,
    read file by file and batch by batch with a progress line."""
    images = resolve(root, cfg.data.images) if cfg.data.images else None
    if images is not None and not images.is_dir():
        raise DatasetInvalid(f"data.images: {images} is not a folder; expected the folder your relative image "
                             "paths resolve in")
    paths = [path for entry in entries for path in dataset_files(resolve(root, entry))]
    counts = [parquet_rows(p) for p in paths]
    progress = Progress("rows", sum(counts) if None not in counts else None,
                        say=lambda line: say("data", f"data.{split}: {line}"))
    frames = []
    for path in paths:
        frame = file_rows(path, images or path.parent, store, cfg.data.columns, cfg.data.allow_outside_images,
                          progress=progress.update)
        if frame.empty:
            raise DatasetInvalid(f"data.{split}: {path}: no rows; expected at least one record")
        frame["file"] = [path] * len(frame)
        frames.append(frame)
    progress_done(progress)
    frame = pd.concat(frames, ignore_index=True)
    if split in ANSWER_NEEDED:
        missing = frame[frame["parsed"] & frame["answer"].isna()]
        if len(missing):
            shown = ", ".join(f"{s} (id {i!r})" for s, i in zip(missing["source"][:5], missing["id"][:5]))
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise DatasetInvalid(f"data.{split}: {len(missing)} question(s) without an answer: {shown}{more}; "
                                 "expected an `answer` field (or verl's reward_model.ground_truth, or map yours "
                                 "with data.columns.answer): the judge compares responses with it")
    return frame


def check_ids_across_splits(frames: dict[str, pd.DataFrame]) -> None:
    """A question in two splits leaks what is tested into what is trained on (or counts it twice)."""
    where: dict[str, tuple[str, str]] = {}
    clashes = []
    for split, frame in frames.items():
        for rid, source in zip(frame["id"], frame["source"]):
            if rid in where and where[rid][0] != split:
                clashes.append(f"id {rid!r} in data.{where[rid][0]} ({where[rid][1]}) and data.{split} ({source})")
            where.setdefault(rid, (split, source))
    if clashes:
        more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
        raise DatasetInvalid(f"{len(clashes)} question id(s) in two splits: {'; '.join(clashes[:5])}{more}; "
                             "expected every question in one split only")


def run(cfg: Config, root: Path, run) -> None:
    if cfg.data.source != "files":
        raise UserFacingError("the data stage imports data.source: files, but params.yaml says "
                              f"{cfg.data.source!r}: run `protege dag` to write dvc.yaml for it")
    run.log_params(cfg.data.model_dump(mode="json"), "data.")
    ensure_pool(root)  # sft lists the retraining pool as a dependency, so it exists from the start (empty)
    store = ImageStore(cache_folder(root / IMPORTED), cfg.data.images_in_place)
    fresh = root / IMPORTED.parent / f".{IMPORTED.name}.new"
    try:
        frames = {split: read_split(cfg, root, split, entries, store)
                  for split, entries in cfg.data.split_files().items()}
        check_ids_across_splits(frames)
        if "val" not in frames:
            say("data", "data.val is null: the RL stages draw no learning curve")
        shutil.rmtree(fresh, ignore_errors=True)
        # every split checked before one is written
        staged = {split: stage_split(frame, fresh, split, shown_out=IMPORTED) for split, frame in frames.items()}
        results = {split: write_table(staged[split], fresh, store) for split in SPLITS if split in staged}
    except DatasetInvalid as exc:
        shutil.rmtree(fresh, ignore_errors=True)
        raise store.kept(exc) from None
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    out = root / IMPORTED
    old = out.parent / f".{IMPORTED.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    fresh.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    store.remove()
    for split, result in results.items():
        run.log_input(IMPORTED / result.table.name, context=f"data:{split}")
    images = len(set().union(*(s.images for s in staged.values())))
    say("data", ", ".join(f"{s}: {r.rows_written} rows" + (f" ({r.duplicates_dropped} duplicates dropped)"
                                                            if r.duplicates_dropped else "")
                          for s, r in results.items()) + f"; {images} images -> {IMPORTED}")
    metrics = {**{f"rows_{s}": r.rows_written for s, r in results.items()},
               **{f"duplicates_{s}": r.duplicates_dropped for s, r in results.items()}, "images": images}
    run.log_metrics(metrics)
    write_stage_metrics(root, "data", metrics)
