"""A study's own warm starts (`warm_start_seeds`), each trained once per seed into
reports/study/<name>/warm_starts/seed-<w>/ from the project's base student, data and params. The warm start
whose seed is params.yaml's own is the project's (the same recipe, the same seed), so it is linked, not
trained again. A run links the warm start its seed plays from (`Study.warm_seed`).

A game study's warm start (`task: agent` / `tool`) is the game's warm-start recipe (agent_sft or tool_sft),
under params.yaml's game or the study's own (`game:`, e.g. EZPoints on a grid project). Its fingerprint holds the
game it is made with, and the project's warm start stands for params.yaml's seed only when the study's game
settings change nothing in params.yaml: a grid warm start is never reused for a card-game study.
A qa study's is everything its RL runs read that depends on the SFT student, the stages between sft and rl
in dvc.yaml, run by their own code in the warm start's folder with seed w:

    sft            models/sft                 the student, from the base student (or `sft.init`)
    curate         data/curated               the RL pool sampled by the SFT student's log-probabilities
    teachers       data/teacher_answers.parquet  the teachers' answers to those questions; the project's
                   data/teachers              content-addressed cache is copied in first (hard links), so
                                              only questions it never asked are asked
    rollouts       data/rollouts              the SFT student's own answers
    disc_pretrain  models/discriminator       (reports/stages/disc_pretrain.json: its held-out figures)

Each stage that finishes leaves a mark (.stages/<stage>, with the warm start's fingerprint): a killed warm
start goes on from the first unmarked stage (sft and disc_pretrain from their own training state). The
fingerprint file is written last: a warm start with it, and the same fingerprint, is finished.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from protege.config import Config, load_config, read_params
from protege.paths import (
    BASE_MODEL,
    CURATED,
    CURATION_PLOTS,
    CURATION_REPORT,
    DISCRIMINATOR,
    ROLLOUTS,
    SFT_MODEL,
    SOURCE_DIRS,
    STAGE_METRICS,
    TEACHER_ANSWERS,
    TEACHER_CACHE,
    TRAINING_STATES,
)
from protege.stages.games import GAMES
from protege.study.spec import RunSpec, Study, deep_merge, describe, expand

WARM_DIR = "warm_starts"
DONE = "fingerprint.txt"   # written last: a warm start with it (and the same fingerprint) is finished
MARKS = ".stages"          # a qa warm start's finished stages: <stage> holds the fingerprint it finished under
DIGESTS = "digests.json"   # a qa warm start's outputs by content (md5), for the run folders' dvc.lock
QA_STAGES = ("sft", "curate", "teachers", "rollouts", "disc_pretrain")   # in dvc.yaml's order
# what each qa stage writes (removed before it runs again, as `dvc repro` does)
QA_STAGE_OUTPUTS = {"sft": (SFT_MODEL,), "curate": (CURATED, CURATION_REPORT, CURATION_PLOTS),
                    "teachers": (TEACHER_ANSWERS,), "rollouts": (ROLLOUTS.parent,), "disc_pretrain": (DISCRIMINATOR,)}
# what a qa run links from its warm start in place of the project's
QA_OUTPUTS = (SFT_MODEL, CURATED, TEACHER_CACHE, TEACHER_ANSWERS, ROLLOUTS.parent, DISCRIMINATOR)
QA_VERSION = "qa-warm-start-1"  # part of the fingerprint: a change to what the warm start is retrains it


def stages(task: str) -> tuple[str, ...]:
    """The dvc.yaml stages one warm start of a `task` study runs."""
    return QA_STAGES if task == "qa" else (GAMES[task].sft_stage,)


def project_config(study: Study, game: bool = False) -> Config:
    """params.yaml's config (with `game`: under the study's own game settings, what its game warm starts are made
    with), a relative model.path still the project's."""
    params_file = study.project / "params.yaml"
    if game and study.game:
        raw, _ = read_params(params_file)
        cfg = Config.model_validate(deep_merge(raw, expand(study.game, "game", params_file)))
    else:
        cfg = load_config(params_file)
    if cfg.model.path is not None and not Path(cfg.model.path).expanduser().is_absolute():
        # the warm start trains in its own folder: a relative model.path stays the project's
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"path": str(study.project / Path(cfg.model.path).expanduser())})})
    return cfg


def folder(study: Study, seed: int) -> Path:
    return study.out_dir / WARM_DIR / f"seed-{seed}"


def game_settings(cfg: Config, task: str) -> dict:
    """What a game warm start is made with from its section: the section but its RL settings and the final
    evaluation's size (the runs' settings)."""
    return GAMES[task].config(cfg).model_dump(exclude={"rl", "eval_episodes", "eval_batch"})


def plays_projects_game(study: Study) -> bool:
    """Whether the study's warm starts are made with params.yaml's game settings: no `game:`, or one that changes
    nothing there. Otherwise none of them is the project's (models/<task>_sft plays another game)."""
    if not study.game or study.task not in GAMES:
        return True
    return game_settings(project_config(study), study.task) == game_settings(project_config(study, True), study.task)


def is_projects(study: Study, seed: int) -> bool:
    """Whether the warm start of `seed` is the project's own (linked): params.yaml's seed, under its game."""
    return seed == load_config(study.project / "params.yaml").seed and plays_projects_game(study)


def root(study: Study, seed: int | None) -> Path:
    """The folder holding the warm start of `seed` (laid out as a project): the project's own for its seed
    (and for None: a run without warm_start_seeds), else the study's warm-start folder."""
    return study.project if seed is None or is_projects(study, seed) else folder(study, seed)


def model_dir(study: Study, seed: int) -> Path:
    """The warm-start checkpoint the runs of warm-start seed `seed` play from (a qa study's SFT student)."""
    rel = SFT_MODEL if study.task == "qa" else GAMES[study.task].sft_model
    return root(study, seed) / rel


def fingerprint(study: Study, seed: int) -> str:
    """What the warm start of `seed` depends on: its recipe's settings, the seed and the inputs it reads."""
    if study.task == "qa":
        return qa_fingerprint(study, seed)
    from protege.stages.common import inputs_digest
    from protege.stages.student_model import model_path
    from protege.train.agent_sft import sft_fingerprint

    cfg = project_config(study, game=True)  # the study's game, when it has one of its own
    base = model_path(cfg, study.project)
    digest = (cfg.model.digest or "") if base is not None else inputs_digest(study.project, [BASE_MODEL])
    return sft_fingerprint(GAMES[study.task].config(cfg), cfg.world.image_size, seed, digest)


def qa_inputs(cfg: Config) -> list[Path]:
    """What a qa warm start reads from the project (besides params): the questions (the data source's folder:
    train split for sft, rl split for curate), the retraining pool, and the student sft starts from."""
    from protege.pool import POOL

    out = [SOURCE_DIRS[cfg.data.source], POOL]
    if cfg.model.path is None:
        out.append(BASE_MODEL)
    if Path(cfg.sft.init) != BASE_MODEL:
        out.append(Path(cfg.sft.init))
    return out


def qa_fingerprint(study: Study, seed: int) -> str:
    from protege.stages.common import inputs_digest

    cfg = load_config(study.project / "params.yaml")  # as written: where the project lies is no part of it
    dump = cfg.model_dump()
    settings = {k: dump[k] for k in ("sft", "curate", "teachers", "rollouts", "disc_pretrain", "model")}
    settings.update({"data.source": cfg.data.source, "world.accounts": cfg.world.accounts})
    inputs = inputs_digest(study.project, qa_inputs(cfg), [cfg.model.digest or ""])
    return hashlib.sha256(json.dumps([QA_VERSION, settings, seed, inputs], sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def finished(study: Study, seed: int) -> bool:
    if is_projects(study, seed):
        return True
    done = folder(study, seed) / DONE
    return done.exists() and done.read_text().strip() == fingerprint(study, seed) and model_dir(study, seed).exists()


def pending(study: Study, runs: list[RunSpec]) -> list[int]:
    """The warm-start seeds the `runs` play from that ensure() would train now."""
    return [s for s in sorted({r.warm_seed for r in runs if r.warm_seed is not None}) if not finished(study, s)]


def digests(study: Study, seed: int) -> dict[str, str]:
    """A finished qa warm start's outputs by content, as `path: md5` (empty for the project's own)."""
    try:
        return json.loads((root(study, seed) / DIGESTS).read_text()) if not is_projects(study, seed) else {}
    except (OSError, ValueError):
        return {}


def ensure(study: Study, runs: list[RunSpec], log: Callable[[str], None] = print) -> None:
    """Trains each warm start the pending `runs` play from that is not finished (a killed one resumes from its
    training state); one after another, before the runs start."""
    for seed in pending(study, runs):
        if study.task == "qa":
            ensure_qa(study, seed, log)
        else:
            ensure_game(study, seed, log)


def _link_base(study: Study, cfg: Config, dst: Path) -> None:
    if cfg.model.path is None:  # the world's tiny student: the project's models/base
        _symlink(study.project / BASE_MODEL, dst / BASE_MODEL)


def _symlink(src: Path, dst: Path) -> None:
    if dst.is_symlink() or dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(src)


def ensure_game(study: Study, seed: int, log: Callable[[str], None]) -> None:
    from protege.stages import agent_sft
    from protege.stages.common import QuietRun

    dst = folder(study, seed)
    (dst / DONE).unlink(missing_ok=True)
    shutil.rmtree(dst / GAMES[study.task].sft_model, ignore_errors=True)
    cfg = project_config(study, game=True).model_copy(update={"seed": seed})
    _link_base(study, cfg, dst)
    log(f"{study.part + ':' if study.part else ''}warm start seed {seed}: training "
        f"{GAMES[study.task].sft_stage}{describe_game(study, ' (', ')')} in {dst}")
    agent_sft.run_game(cfg, GAMES[study.task].config(cfg), dst, QuietRun())
    (dst / DONE).write_text(fingerprint(study, seed) + "\n")


def describe_game(study: Study, before: str = "", after: str = "") -> str:
    """The study's own game settings as 'agent.env=points24 agent.points24.cards=2' (between `before` and
    `after`), or '' when it plays params.yaml's."""
    return f"{before}{describe(study.game)}{after}" if study.game else ""


def qa_config(study: Study, seed: int) -> Config:
    """The project's params with the warm start's seed, its relative paths (model.path, local teachers' models)
    still the project's."""
    cfg = project_config(study).model_copy(update={"seed": seed})
    pool = [t.model_copy(update={"model": str(study.project / Path(t.model).expanduser())})
            if t.backend in ("transformers", "vllm") and t.model and not Path(t.model).expanduser().is_absolute()
            else t for t in cfg.teachers.pool]
    return cfg.model_copy(update={"teachers": cfg.teachers.model_copy(update={"pool": pool})})


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def link_qa_inputs(study: Study, cfg: Config, dst: Path) -> None:
    """The project's inputs a qa warm start reads, linked into its folder (data/ is a folder of its own: the
    warm start writes data/curated, data/rollouts, ... there)."""
    for rel in qa_inputs(cfg):
        if (study.project / rel).exists():
            _symlink(study.project / rel, dst / rel)
    if not (dst / TEACHER_CACHE).exists() and (study.project / TEACHER_CACHE).is_dir():
        # the cache's shards are written once and never changed, its index is replaced by a rename: a copy of
        # hard links shares the answers already paid for and leaves the project's cache as it is
        tmp = dst / TEACHER_CACHE.with_name(TEACHER_CACHE.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(study.project / TEACHER_CACHE, tmp, symlinks=True, copy_function=_link_or_copy)
        os.replace(tmp, dst / TEACHER_CACHE)


def ensure_qa(study: Study, seed: int, log: Callable[[str], None]) -> None:
    """One qa warm start: sft, curate, teachers, rollouts, disc_pretrain by their own stage code in the warm
    start's folder, from the first stage not yet finished under this fingerprint."""
    from protege.stages import stage_module
    from protege.stages.common import QuietRun
    from protege.tracking import content_md5

    dst, fp = folder(study, seed), fingerprint(study, seed)
    (dst / DONE).unlink(missing_ok=True)
    cfg = qa_config(study, seed)
    dst.mkdir(parents=True, exist_ok=True)
    link_qa_inputs(study, cfg, dst)
    marks = dst / MARKS
    start = next((i for i, s in enumerate(QA_STAGES) if not _marked(marks / s, fp)), len(QA_STAGES))
    for stage in QA_STAGES[start:]:  # a stage run again invalidates every stage after it
        (marks / stage).unlink(missing_ok=True)
    name = f"{study.part + ':' if study.part else ''}warm start seed {seed}"
    if start:
        log(f"{name}: {', '.join(QA_STAGES[:start])} finished earlier")
    for stage in QA_STAGES[start:]:
        for rel in QA_STAGE_OUTPUTS[stage]:
            target = dst / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        log(f"{name}: {stage} in {dst}")
        stage_module(stage).run(cfg, dst, QuietRun())
        marks.mkdir(exist_ok=True)
        (marks / stage).write_text(fp + "\n")
    shutil.rmtree(dst / TRAINING_STATES, ignore_errors=True)
    sums = {str(rel): content_md5(dst / rel) for rel in QA_OUTPUTS if (dst / rel).exists()}
    (dst / DIGESTS).write_text(json.dumps(sums, indent=1, sort_keys=True))
    (dst / DONE).write_text(fp + "\n")
    auroc = _stage_figure(dst, "disc_pretrain", "heldout_auroc")
    log(f"{name}: ready" + (f" (discriminator held-out AUROC {auroc:.3f})" if auroc is not None else ""))


def _marked(mark: Path, fp: str) -> bool:
    try:
        return mark.read_text().strip() == fp
    except OSError:
        return False


def _stage_figure(base: Path, stage: str, key: str) -> float | None:
    try:
        return float(json.loads((base / STAGE_METRICS / f"{stage}.json").read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None
