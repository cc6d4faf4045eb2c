"""data: your own files (`data.source: files`) as the question tables every later stage reads.

Each split (`data.train`, `data.rl`, `data.val`, `data.test`: a file, a folder or a list of them) is read as
it comes (protege.data.layouts: LLaVA conversations, flat JSON / JSONL records, parquet tables such as
Hugging Face exports or verl / EasyR1 RL tables), its images stored once by content under
data/imported/images/, and checked by the same Great Expectations suite as `protege data import`. Every file
is read and checked before anything is written: a missing or empty split, an unknown layout, a mapped
column a file lacks, an RL / val / test question without an answer and a question id in two splits stop
the stage naming the file and row. The new tables replace the last good import only once every split has
passed, so a bad file loses nothing already imported (dvc.yaml keeps the folder between runs).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from protege.config import Config
from protege.data.importers import file_frame, stage_split, write_table
from protege.data.layouts import dataset_files
from protege.data.validate import DatasetInvalid
from protege.errors import UserFacingError
from protege.paths import IMPORTED, SPLITS
from protege.pool import ensure_pool
from protege.stages.common import say, write_stage_metrics

ANSWER_NEEDED = ("rl", "val", "test")  # the judge compares with it; SFT can train on the target alone


def resolve(root: Path, entry: str) -> Path:
    path = Path(entry).expanduser()
    return path if path.is_absolute() else root / path


def read_split(cfg: Config, root: Path, split: str, entries: list[str]) -> tuple[pd.DataFrame, dict[Path, Path]]:
    """A split's rows from all its files (column `file`: the row's file) and each file's image folder."""
    frames, roots = [], {}
    images = resolve(root, cfg.data.images) if cfg.data.images else None
    if images is not None and not images.is_dir():
        raise DatasetInvalid(f"data.images: {images} is not a folder; expected the folder your relative image "
                             "paths resolve in")
    for entry in entries:
        for path in dataset_files(resolve(root, entry)):
            frame = file_frame(path, cfg.data.columns)
            if frame.empty:
                raise DatasetInvalid(f"data.{split}: {path}: no rows; expected at least one record")
            frame["file"] = [path] * len(frame)
            frames.append(frame)
            roots[path] = images or path.parent
    frame = pd.concat(frames, ignore_index=True)
    if split in ANSWER_NEEDED:
        missing = frame[frame["parsed"] & frame["answer"].isna()]
        if len(missing):
            shown = ", ".join(f"{s} (id {i!r})" for s, i in zip(missing["source"][:5], missing["id"][:5]))
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise DatasetInvalid(f"data.{split}: {len(missing)} question(s) without an answer: {shown}{more}; "
                                 "expected an `answer` field (or verl's reward_model.ground_truth, or map yours "
                                 "with data.columns.answer): the judge compares responses with it")
    return frame, roots


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
    frames, roots = {}, {}
    for split, entries in cfg.data.split_files().items():
        frames[split], roots[split] = read_split(cfg, root, split, entries)
    check_ids_across_splits(frames)
    if "val" not in frames:
        say("data", "data.val is null: the RL stages draw no learning curve")
    fresh = root / IMPORTED.parent / f".{IMPORTED.name}.new"
    shutil.rmtree(fresh, ignore_errors=True)
    staged = {}
    try:
        for split, frame in frames.items():  # every split checked before one is written
            staged[split] = stage_split(frame, roots[split], fresh, split, cfg.data.allow_outside_images,
                                         shown_out=IMPORTED)
        results = {split: write_table(staged[split], fresh) for split in SPLITS if split in staged}
    except BaseException:
        for s in staged.values():
            shutil.rmtree(s.staging, ignore_errors=True)
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    out = root / IMPORTED
    old = out.parent / f".{IMPORTED.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    fresh.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    for split, result in results.items():
        run.log_input(IMPORTED / result.table.name, context=f"data:{split}")
    images = len(list((out / "images").iterdir()))
    say("data", ", ".join(f"{s}: {r.rows_written} rows" + (f" ({r.duplicates_dropped} duplicates dropped)"
                                                            if r.duplicates_dropped else "")
                          for s, r in results.items()) + f"; {images} images -> {IMPORTED}")
    metrics = {**{f"rows_{s}": r.rows_written for s, r in results.items()},
               **{f"duplicates_{s}": r.duplicates_dropped for s, r in results.items()}, "images": images}
    run.log_metrics(metrics)
    write_stage_metrics(root, "data", metrics)
