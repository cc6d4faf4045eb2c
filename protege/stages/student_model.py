"""The student model of a stage: which folder it starts from (`model.path` or the world's student), loaded with
the project's model settings, its LoRA adapters, and what its MLflow run records about it. Kept apart from
stages/common.py so the stages that never load a model do not depend on the model code."""
from __future__ import annotations

from pathlib import Path

from protege import tracking

DIGEST_CACHE = Path(".dvc/tmp/protege-model-digests.json")  # per project: md5s of files already read


def model_path(cfg, root: Path) -> Path | None:
    """`model.path` as a folder (relative paths are the project's), or None for the embedded world's student."""
    if cfg.model.path is None:
        return None
    p = Path(cfg.model.path).expanduser()
    return p if p.is_absolute() else root / p


def pinned_digest(cfg, root: Path) -> str:
    """The content digest of `model.path` (checked as a checkpoint folder first)."""
    from protege.models.hf_folder import check_folder, folder_digest

    path = model_path(cfg, root)
    check_folder(path, cfg.model.trust_remote_code)
    return folder_digest(path, root / DIGEST_CACHE)


def base_model_dir(cfg, root: Path) -> Path:
    """The student every run starts from: `model.path`, or the world's tiny student at models/base. A
    `model.path` whose files differ from `model.digest` is refused: DVC would not know it changed."""
    from protege.errors import UserFacingError
    from protege.paths import BASE_MODEL

    path = model_path(cfg, root)
    if path is None:
        return root / BASE_MODEL
    now = pinned_digest(cfg, root)
    if cfg.model.digest != now:
        said = f"is {cfg.model.digest}" if cfg.model.digest else "is not set"
        raise UserFacingError(f"params.yaml: model.digest {said}, but {path} now has digest {now}: run "
                              "`protege model pin` so DVC re-runs what the model feeds (`protege pipeline` pins it "
                              "itself)")
    return path


def init_dir(cfg, root: Path) -> Path:
    """Where SFT starts: `sft.init`, whose default (models/base) means the base student."""
    from protege.paths import BASE_MODEL

    return base_model_dir(cfg, root) if Path(cfg.sft.init) == BASE_MODEL else root / cfg.sft.init


def load_model(cfg, path: Path, device=None):
    """(model, processor) of a checkpoint folder with the project's model settings, read onto `device` (a GPU:
    directly, with no copy of the whole model in host memory)."""
    from protege.models.precision import DTYPES, with_precision
    from protege.models.student import load_student

    model, processor = load_student(path, dtype=DTYPES[cfg.model.dtype], trust_remote_code=cfg.model.trust_remote_code,
                                    device=device)
    with_precision(model, cfg.model.dtype)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model, processor


def log_start_model(cfg, root: Path, run, path: Path, context: str = "init") -> None:
    """Records the model a stage starts from: its architecture and a digest of its weights (DVC's md5 for a
    project folder, the pinned digest for `model.path`)."""
    from protege.models.hf_folder import architecture, read_config

    external = model_path(cfg, root)
    inside = not (external is not None and Path(path).resolve() == external.resolve())
    if inside:
        run.log_input(Path(path).relative_to(root), context=context)
    digest = tracking.input_digest(root, Path(path).relative_to(root)) if inside else cfg.model.digest
    run.log_params({"architecture": architecture(read_config(path)), "weights_digest": digest,
                    "path": str(path if not inside else Path(path).relative_to(root))}, f"{context}_model.")


def with_lora(cfg, model, trainable: str):
    """The model with fresh adapters (model.lora) when a stage's trainable is `lora`, else as it is."""
    if trainable != "lora":
        return model
    from protege.models.lora import add_lora

    lo = cfg.model.lora
    return add_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules)
