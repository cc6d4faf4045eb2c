"""A game study's own warm starts (`warm_start_seeds`): the game's warm-start recipe (agent_sft or tool_sft)
trained once per seed into reports/study/<name>/warm_starts/seed-<w>/, from the project's base student and
params. The warm start whose seed is params.yaml's own is the project's (the same recipe, the same seed), so
it is linked, not trained again. A run links the warm start its seed plays from (`Study.warm_seed`)."""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from protege.config import Config, load_config
from protege.paths import BASE_MODEL
from protege.stages.games import GAMES
from protege.study.spec import RunSpec, Study

WARM_DIR = "warm_starts"
DONE = "fingerprint.txt"   # written last: a warm start with it (and the same fingerprint) is finished


def project_config(study: Study) -> Config:
    cfg = load_config(study.project / "params.yaml")
    if cfg.model.path is not None and not Path(cfg.model.path).expanduser().is_absolute():
        # the warm start trains in its own folder: a relative model.path stays the project's
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"path": str(study.project / Path(cfg.model.path).expanduser())})})
    return cfg


def folder(study: Study, seed: int) -> Path:
    return study.out_dir / WARM_DIR / f"seed-{seed}"


def is_projects(study: Study, seed: int) -> bool:
    return seed == load_config(study.project / "params.yaml").seed


def model_dir(study: Study, seed: int) -> Path:
    """The warm-start checkpoint the runs of warm-start seed `seed` play from."""
    rel = GAMES[study.task].sft_model
    return study.project / rel if is_projects(study, seed) else folder(study, seed) / rel


def fingerprint(study: Study, seed: int) -> str:
    """What the warm start of `seed` depends on: the game's warm-start settings, the seed and the base student."""
    from protege.stages.common import inputs_digest
    from protege.stages.student_model import model_path
    from protege.train.agent_sft import sft_fingerprint

    cfg = project_config(study)
    base = model_path(cfg, study.project)
    digest = (cfg.model.digest or "") if base is not None else inputs_digest(study.project, [BASE_MODEL])
    return sft_fingerprint(GAMES[study.task].config(cfg), cfg.world.image_size, seed, digest)


def finished(study: Study, seed: int) -> bool:
    if is_projects(study, seed):
        return True
    done = folder(study, seed) / DONE
    return done.exists() and done.read_text().strip() == fingerprint(study, seed) and model_dir(study, seed).exists()


def ensure(study: Study, runs: list[RunSpec], log: Callable[[str], None] = print) -> None:
    """Trains each warm start the pending `runs` play from that is not finished (a killed one resumes from its
    training state); one after another, before the runs start."""
    from protege.stages import agent_sft
    from protege.stages.common import QuietRun

    for seed in sorted({r.warm_seed for r in runs if r.warm_seed is not None}):
        if finished(study, seed):
            continue
        root = folder(study, seed)
        (root / DONE).unlink(missing_ok=True)
        shutil.rmtree(root / GAMES[study.task].sft_model, ignore_errors=True)
        cfg = project_config(study).model_copy(update={"seed": seed})
        if cfg.model.path is None:  # the world's tiny student: the project's models/base
            (root / BASE_MODEL).parent.mkdir(parents=True, exist_ok=True)
            if not (root / BASE_MODEL).exists():
                (root / BASE_MODEL).symlink_to(study.project / BASE_MODEL)
        log(f"{study.part + ':' if study.part else ''}warm start seed {seed}: training "
            f"{GAMES[study.task].sft_stage} in {root}")
        agent_sft.run_game(cfg, GAMES[study.task].config(cfg), root, QuietRun())
        (root / DONE).write_text(fingerprint(study, seed) + "\n")
