"""A model as a Hugging Face folder: checks, the processor (with its image-only path), weights, copies.

Every checkpoint protege reads or writes is such a folder: config.json, safetensors weights, and the
processor's own files (tokenizer, image processor, chat template, processor config). Models load through
`AutoModelForImageTextToText` and processors through `AutoProcessor`, so each family brings its own image
placeholders, turn markers and image preprocessing.

The image-only path. transformers builds a VLM processor with all its sub-processors, and the video
processors of Qwen-VL, InternVL, LLaVA-OneVision, SmolVLM and others need torchvision. Where torchvision
is missing (the CPU build of torch here has no torchvision that loads beside it), `load_processor` builds
the folder's own processor class from the folder's own tokenizer, image processor (its PIL backend) and
processor config, with no video processor. protege never feeds video, so nothing else changes.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from protege import provenance
from protege.errors import UserFacingError

# what a checkpoint folder holds besides its processor files
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json",
               "pytorch_model.bin.index.json", "adapter_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class CheckpointError(UserFacingError):
    """A folder that cannot be used as a model; the message names the folder and what is missing."""


def read_config(path: Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder; expected a Hugging Face checkpoint folder "
                              "(config.json, *.safetensors, processor and tokenizer files)")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{path}: not a Hugging Face checkpoint (config.json missing)")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{cfg}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise CheckpointError(f"{cfg}: no 'model_type'; expected a transformers model config")
    return data


def check_weights(path: Path) -> None:
    """safetensors only: a folder with only pickled weights (.bin / .pt) is refused, never unpickled."""
    names = [p.name for p in Path(path).iterdir() if p.is_file()]
    if not any(n.endswith(".safetensors") for n in names):
        pickled = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        raise CheckpointError(f"{path}: no *.safetensors weights"
                              + (f" (only {', '.join(sorted(pickled))}, which protege never unpickles: convert "
                                 "them with `save_pretrained(..., safe_serialization=True)`)" if pickled else ""))


def architecture(config: dict) -> str:
    archs = config.get("architectures") or []
    return archs[0] if archs else config["model_type"]


def _needs_remote_code(path: Path, config: dict) -> bool:
    return bool(config.get("auto_map")) or any(Path(path).glob("*.py"))


def check_folder(path: Path, trust_remote_code: bool = False) -> dict:
    """Everything about a model folder that can be known before loading it; returns its config. Raises
    CheckpointError naming the folder and what is missing or wrong."""
    path = Path(path)
    config = read_config(path)
    if _needs_remote_code(path, config) and not trust_remote_code:
        raise CheckpointError(f"{path}: this model family ships its own code (auto_map in config.json); set "
                              "model.trust_remote_code: true to run it")
    check_weights(path)
    _check_image_text_to_text(path, config, trust_remote_code)
    _check_processor_files(path)
    return config


def _check_image_text_to_text(path: Path, config: dict, trust_remote_code: bool) -> None:
    if config.get("auto_map"):
        if trust_remote_code and not any("ImageTextToText" in k or "Vision2Seq" in k or "CausalLM" in k
                                         for k in config["auto_map"]):
            raise CheckpointError(f"{path}: its auto_map names no image-text-to-text class "
                                  f"({', '.join(config['auto_map'])})")
        return
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_type = config["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise CheckpointError(f"{path}: model_type '{model_type}' is unknown to this transformers; expected an "
                              "image-text-to-text family (or set model.trust_remote_code for a family that ships "
                              "its code)")
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise CheckpointError(f"{path}: model_type '{model_type}' ({architecture(config)}) has no "
                              "image-text-to-text class in transformers; expected a vision-language model")


def _check_processor_files(path: Path) -> None:
    names = {p.name for p in path.iterdir() if p.is_file()}
    if not names & {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"}:
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json); a model "
                              "folder must hold its processor and tokenizer")
    if not names & {"preprocessor_config.json", "processor_config.json"}:
        raise CheckpointError(f"{path}: no image processor config (preprocessor_config.json or "
                              "processor_config.json); a model folder must hold its processor")
    if not has_chat_template(path):
        raise CheckpointError(f"{path}: no chat template (chat_template.jinja, chat_template.json, or "
                              "'chat_template' in tokenizer_config.json / processor_config.json); protege renders "
                              "every prompt with the model's own template")


def has_chat_template(path: Path) -> bool:
    if any((path / n).is_file() for n in CHAT_TEMPLATE_FILES):
        return True
    for name in ("tokenizer_config.json", "processor_config.json"):
        f = path / name
        if f.is_file():
            try:
                if json.loads(f.read_text(encoding="utf-8")).get("chat_template"):
                    return True
            except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                continue
    return False


# ------------------------------------------------------------------------------------------ processor

def torchvision_available() -> bool:
    from transformers.utils import is_torchvision_available

    return is_torchvision_available()


@contextlib.contextmanager
def _no_video_processor_allowed():
    """ProcessorMixin checks each sub-processor's class; an absent video processor is what the image-only
    path means, so that one check lets None through while the block runs."""
    from transformers import processing_utils
    from transformers.processing_utils import ProcessorMixin

    original = ProcessorMixin.check_argument_for_proper_class

    def check(self, name, arg):
        if arg is None and processing_utils._get_modality_for_attribute(name) == "video_processor":
            return None
        return original(self, name, arg)

    ProcessorMixin.check_argument_for_proper_class = check
    try:
        yield
    finally:
        ProcessorMixin.check_argument_for_proper_class = original


def processor_class(path: Path, trust_remote_code: bool = False):
    """The folder's processor class: `processor_class` in its processor / preprocessor / tokenizer config,
    else the one transformers maps its model type to."""
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING, processor_class_from_name

    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        f = path / name
        if f.is_file():
            try:
                named = json.loads(f.read_text(encoding="utf-8")).get("processor_class")
            except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                named = None
            if named:
                cls = processor_class_from_name(named)
                if cls is not None:
                    return cls
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if type(config) in PROCESSOR_MAPPING:
        return PROCESSOR_MAPPING[type(config)]
    raise CheckpointError(f"{path}: transformers knows no processor class for model_type '{config.model_type}'")


def _image_only_processor(path: Path, trust_remote_code: bool):
    from transformers import AutoImageProcessor, AutoTokenizer, processing_utils

    cls = processor_class(path, trust_remote_code)
    args = []
    for attribute in cls.get_attributes():
        modality = processing_utils._get_modality_for_attribute(attribute)
        if modality == "tokenizer":
            args.append(AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code))
        elif modality == "image_processor":
            args.append(AutoImageProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code))
        elif modality == "video_processor":
            args.append(None)
        else:
            raise CheckpointError(f"{path}: {cls.__name__} needs a {attribute}; protege reads images and text only")
    processor_dict, kwargs = cls.get_processor_dict(str(path))
    with _no_video_processor_allowed():
        return cls.from_args_and_dict(args, processor_dict, **kwargs)


def load_processor(path: str | Path, trust_remote_code: bool = False):
    """The folder's own transformers processor; without torchvision, its image-only form (module doc)."""
    from transformers import AutoProcessor

    path = Path(path)
    if not torchvision_available():
        processor = _image_only_processor(path, trust_remote_code)
    else:
        processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if getattr(processor, "image_processor", None) is None:
        raise CheckpointError(f"{path}: its processor ({type(processor).__name__}) has no image processor; "
                              "expected a vision-language model's processor")
    if not getattr(processor, "chat_template", None):
        raise CheckpointError(f"{path}: no chat template; protege renders every prompt with the model's own template")
    return processor


# ------------------------------------------------------------------------------------------ copies

def processor_files(path: Path) -> list[Path]:
    """The files of a folder that are not the model's weights or config: tokenizer, processor configs,
    chat template, and remote code."""
    out = []
    for p in sorted(Path(path).iterdir()):
        if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES) and p.name not in MODEL_FILES \
                and p.name != provenance.FILE and not p.name.startswith("."):
            out.append(p)
    return out


def copy_processor_files(source: Path, dest: Path) -> None:
    """A checkpoint carries its processor unchanged from the folder the model came from, so each family's
    files (video processor configs included, for machines that have torchvision) travel as they were."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for f in processor_files(source):
        if f.resolve() != (dest / f.name).resolve():
            shutil.copy2(f, dest / f.name)


# ------------------------------------------------------------------------------------------ identity

def folder_digest(path: str | Path, cache: str | Path | None = None) -> str:
    """What a model folder is, by content: the md5 of every file (weights, configs, processor files) and its
    name. A 15 GB checkpoint is read once: `cache` (a JSON file) keeps each file's md5 under its path, size,
    modification time and inode, and a file whose stat is unchanged is not read again (as DVC's state does).
    The identity itself never depends on those stats."""
    import hashlib

    from protege.files import file_md5

    path = Path(path).resolve()
    known: dict = {}
    cache = Path(cache) if cache is not None else None
    if cache is not None and cache.is_file():
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
    h, changed = hashlib.sha256(), False
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not any(x.startswith(".") for x in
                                                                           p.relative_to(path).parts)):
        st = f.stat()
        key = f"{f}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        md5 = known.get(key)
        if md5 is None:
            md5 = known[key] = file_md5(f)
            changed = True
        h.update(f"{f.relative_to(path).as_posix()}\0{md5}\n".encode())
    if cache is not None and changed:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + ".tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(cache)
    return h.hexdigest()[:32]
