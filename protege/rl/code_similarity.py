"""Text embedders for GTPO's code-similarity shaping (`protege.rl.gtpo.similarity_shaping`).

An embedder maps a list of n texts to an [n, D] float32 tensor of unit rows (an empty text may map to
the zero row, whose cosine with anything is 0). Two kinds:
- `HashingEmbedder`: no model, no download; hashed character n-grams and code tokens. The default, and
  what the tests and CPU-only runs use.
- `SentenceEmbedder`: a local sentence-embedding model (the paper's choice), loaded from a folder.
"""
from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from pathlib import Path
from typing import Callable

import torch

from protege.errors import UserFacingError

Embedder = Callable[[list[str]], torch.Tensor]

# identifiers, numbers, multi-character operators, then any other single non-space symbol
_CODE_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?|\*\*=?|//=?|[=!<>+\-*/%&|^]=|<<|>>|->|[^\s\w]")
_WS = re.compile(r"\s+")


class HashingEmbedder:
    """Hashing vectoriser over character n-grams and code tokens, sublinear tf, L2-normalised.

    dim: buckets (D); ngram: (lo, hi) character n-gram sizes, inclusive; tokens: also count the regex
    code tokens (identifiers, numbers, operators), which catches shared names that n-grams split;
    lowercase: fold case first. crc32 rather than Python's hash(): hash() is salted per process, and the
    same code must give the same vector in every worker and on resume. Whitespace runs collapse to one
    space so that indentation and blank lines do not dominate the n-gram counts.
    """

    def __init__(self, dim: int = 2 ** 12, ngram: tuple[int, int] = (3, 5), *, tokens: bool = True,
                 lowercase: bool = False):
        lo, hi = ngram
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"ngram must be (lo, hi) with 1 <= lo <= hi, got {ngram!r}")
        self.dim, self.ngram, self.tokens, self.lowercase = dim, (lo, hi), tokens, lowercase

    def _features(self, text: str) -> Counter:
        s = _WS.sub(" ", text.lower() if self.lowercase else text).strip()
        feats: Counter = Counter()
        lo, hi = self.ngram
        for n in range(lo, hi + 1):
            feats.update("c" + s[k:k + n] for k in range(len(s) - n + 1))
        if self.tokens:  # a prefix per kind keeps a token from colliding with the same-text n-gram
            feats.update("t" + t for t in _CODE_TOKEN.findall(s))
        return feats

    def __call__(self, texts: list[str]) -> torch.Tensor:
        """texts: n strings -> [n, dim] float32, unit rows (zero row for a text with no features)."""
        out = torch.zeros(len(texts), self.dim, dtype=torch.float32)
        for i, text in enumerate(texts):
            buckets: Counter = Counter()
            for f, c in self._features(text).items():
                buckets[zlib.crc32(f.encode("utf-8")) % self.dim] += c
            if buckets:  # sublinear tf: a repeated line should not swamp the rest
                out[i, list(buckets)] = torch.tensor([1.0 + math.log(c) for c in buckets.values()])
        return out / out.norm(dim=1, keepdim=True).clamp(min=1e-12)


_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                    "tokenizer.model")
_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_EXPECTED = "config.json + *.safetensors weights + tokenizer files (tokenizer.json or vocab.txt, ...)"


def _check_model_folder(folder: Path) -> None:
    """Fail early, naming the folder and what it lacks: transformers' own errors for a local path
    talk about the Hub and repo ids, which misleads in an offline run."""
    if not folder.exists():
        raise UserFacingError(f"sentence-embedding model folder {folder} does not exist; expected a folder "
                              f"with {_EXPECTED}")
    if not folder.is_dir():
        raise UserFacingError(f"{folder} is not a folder; expected a sentence-embedding model folder with "
                              f"{_EXPECTED}")
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json")
    if not any(folder.glob("*.safetensors")):
        pickles = sorted(p.name for pat in _PICKLE_WEIGHTS for p in folder.glob(pat))
        if pickles:
            raise UserFacingError(f"{folder} holds only pickle weights ({', '.join(pickles)}); they are refused "
                                  f"because loading them can run code. Convert them to *.safetensors.")
        missing.append("*.safetensors weights")
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        missing.append("tokenizer files")
    if missing:
        raise UserFacingError(f"{folder} is not a sentence-embedding model folder: missing {', '.join(missing)}; "
                              f"expected {_EXPECTED}")


class SentenceEmbedder:
    """A local encoder (e.g. a sentence-transformers checkpoint's transformer folder): mean of the last
    hidden states over the attention mask, L2-normalised. Never downloads: local_files_only, and
    safetensors only.

    path: the model folder; max_length: tokens per text (longer code is truncated); batch_size: texts
    per forward pass; device: where the model runs.
    """

    def __init__(self, path: str | Path, *, max_length: int = 512, batch_size: int = 32,
                 device: str | torch.device = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        self.path = Path(path)
        _check_model_folder(self.path)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(self.path), local_files_only=True, use_safetensors=True)
        self.model.to(device).eval()
        self.device, self.max_length, self.batch_size = torch.device(device), max_length, batch_size

    @torch.inference_mode()
    def __call__(self, texts: list[str]) -> torch.Tensor:
        """texts: n strings -> [n, hidden] float32 on the CPU, unit rows."""
        chunks = []
        for k in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(list(texts[k:k + self.batch_size]), padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            hidden = self.model(**enc).last_hidden_state.float()  # [b, L, H]
            m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]; padding must not pull the mean
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)  # [b, H]
            chunks.append(pooled.cpu())
        if not chunks:
            return torch.zeros(0, self.model.config.hidden_size)
        e = torch.cat(chunks)  # [n, H]
        return e / e.norm(dim=1, keepdim=True).clamp(min=1e-12)


def make_embedder(path: str | Path | None) -> Embedder:
    """The sentence model in `path` when one is configured, else the model-free hashing embedder."""
    return SentenceEmbedder(path) if path else HashingEmbedder()
