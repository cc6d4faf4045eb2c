"""The revision of a local model teacher: a digest of its checkpoint folder's bytes. Kept apart from the answer
cache (protege.teachers.cache) because the backends that compute it are what the cache imports."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from protege.errors import UserFacingError
from protege.files import file_sha256


def weights_digest(folder: str | Path) -> str:
    """What decides a local model's answers: the bytes of every file of its folder (weights, configs,
    tokenizer, chat template). Retrained weights at the same path are a new revision, so they are asked
    again."""
    folder = Path(folder)
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not any(p.suffix == ".safetensors" for p in files):
        raise UserFacingError(f"{folder}: no *.safetensors weights; a model teacher needs a local checkpoint folder")
    parts = [(p.name, file_sha256(p)) for p in files]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
