"""Safetensors folders, read lazily tensor by tensor and written shard by shard; no pickle anywhere.

Reading: a Hugging Face folder with `model.safetensors` or `model.safetensors.index.json` + shards, any
architecture. Names, shapes and dtypes come from the files' JSON headers alone; a tensor's data is read by
`safetensors.safe_open` opened for that one read and closed at once: a handle kept open maps the file, and every
tensor read through it stays resident in the process (measured: RSS grows by the whole file).

Writing: the output layout (which tensor goes to which shard, and where) is fixed before the first tensor is
merged, because every output shape and dtype is known up front. Each shard's header is written first and each
merged tensor is appended to its shard as soon as it is computed, so no shard is ever held in memory.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from protege import provenance

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".h5", ".msgpack", ".gguf")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json", "tf_model.h5.index.json",
                  "flax_model.msgpack.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.json",
                   "chat_template.jinja", "preprocessor_config.json", "processor_config.json",
                   "video_preprocessor_config.json", "generation_config.json")

# safetensors dtype names <-> torch
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("U16", "uint16"),
                     ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _attr):
        ST_DTYPES[_name] = getattr(torch, _attr)
TORCH_TO_ST = {v: k for k, v in ST_DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """A folder that is not a readable safetensors checkpoint; the message names the folder and the file."""


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def read_header(path: Path) -> dict:
    """The JSON header of one .safetensors file (tensor name -> {dtype, shape, data_offsets}), no data read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER:
                raise CheckpointError(f"{path}: not a safetensors file (header length {n})")
            header = json.loads(f.read(n))
            size = os.fstat(f.fileno()).st_size
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (header is not a mapping)")
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, IndexError, ValueError):
        raise CheckpointError(f"{path}: not a safetensors file (bad data_offsets)") from None
    if 8 + n + end > size:
        raise CheckpointError(f"{path}: truncated ({size} bytes, its header needs {8 + n + end})")
    return header


class Checkpoint:
    """A Hugging Face safetensors folder: tensor names, shapes and dtypes at once, data one tensor at a time."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: not a folder")
        single, index = self.folder / SINGLE, self.folder / INDEX
        if single.exists():
            files = [single]
        elif index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError
            except (OSError, ValueError, KeyError, TypeError):
                raise CheckpointError(f"{index}: not a safetensors index (no weight_map)") from None
            files = []
            for shard in dict.fromkeys(weight_map.values()):
                p = self.folder / shard
                if not p.exists():
                    raise CheckpointError(f"{index}: names shard {shard}, which is missing")
                files.append(p)
        else:
            found = sorted(p.name for p in self.folder.iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
            hint = f" (found: {', '.join(found[:4])}; pickled .bin/.pt weights are never read)" if found else ""
            raise CheckpointError(f"{self.folder}: no {SINGLE} or {INDEX}{hint}")
        self.tensors: dict[str, TensorInfo] = {}
        for path in files:
            for name, meta in read_header(path).items():
                if name == "__metadata__":
                    continue
                if meta.get("dtype") not in ST_DTYPES:
                    raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {meta.get('dtype')}")
                if name in self.tensors:
                    raise CheckpointError(f"{self.folder}: tensor {name} is in both {self.tensors[name].file.name} "
                                          f"and {path.name}")
                self.tensors[name] = TensorInfo(path, ST_DTYPES[meta["dtype"]], tuple(meta["shape"]))

    def names(self) -> list[str]:
        return list(self.tensors)

    def get(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        with safe_open(str(info.file), framework="pt") as f:  # closed at once: see the module docstring
            return f.get_tensor(name)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def non_weight_files(folder: Path) -> list[Path]:
    """Top-level files of a checkpoint folder that are not weights (config.json, tokenizer, processor, ...); an
    input's protege.json says what made that input, not the merge, so it stays behind."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES) and p.name not in WEIGHT_INDEXES
                  and p.name != provenance.FILE)


def parse_size(text: str | int) -> int:
    """'5GB' -> 5_000_000_000, '20KB', '1.5GiB', '123' (bytes); as transformers' max_shard_size."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().replace(" ", "")
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9,
             "TB": 10**12, "K": 10**3, "M": 10**6, "G": 10**9, "B": 1}
    for unit, factor in units.items():
        if s.endswith(unit):
            num = s[:-len(unit)]
            break
    else:
        num, factor = s, 1
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB or a number of bytes)") from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"not a size: {text!r} (must be positive)")
    return int(value * factor)


@dataclass
class _Planned:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    shard: int
    begin: int = 0
    end: int = 0


class ShardedWriter:
    """Writes tensors whose names, dtypes and shapes are known in advance into shards of at most
    `max_shard_bytes` (a single larger tensor gets a shard of its own), streaming each tensor to disk.

    writer.order: the order in which `write` must be called: the specs' own order (the merger passes them in the
    order it computes them), the shards being consecutive runs of it. Within a shard, the data offsets are laid
    out by decreasing element size so every tensor is aligned to its element size; each tensor is written at its
    offset as it comes. One shard is written as model.safetensors, several as model-0000i-of-0000N.safetensors +
    model.safetensors.index.json.
    """

    def __init__(self, folder: Path, specs: list[tuple[str, torch.dtype, tuple[int, ...]]], max_shard_bytes: int,
                 metadata: dict | None = None):
        if max_shard_bytes <= 0:
            raise ValueError("max_shard_bytes must be positive")
        self.folder = Path(folder)
        self.metadata = {"format": "pt", **(metadata or {})}
        shards: list[list[_Planned]] = [[]]
        size = 0
        for name, dtype, shape in specs:
            nbytes = math.prod(shape) * _itemsize(dtype)
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(_Planned(name, dtype, tuple(shape), len(shards) - 1))
            size += nbytes
        self.shards = []
        for items in shards:
            offset = 0
            for p in sorted(items, key=lambda p: -_itemsize(p.dtype)):  # stable: input order within a size
                p.begin = offset
                offset += math.prod(p.shape) * _itemsize(p.dtype)
                p.end = offset
            self.shards.append(items)
        n = len(self.shards)
        self.filenames = [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self.order = [p.name for items in self.shards for p in items]
        self._plan = {p.name: p for items in self.shards for p in items}
        self._next = 0
        self._file = None
        self._shard = -1
        self._data_start = 0

    def _open_shard(self, i: int) -> None:
        self._close()
        header = {"__metadata__": self.metadata}
        for p in self.shards[i]:
            header[p.name] = {"dtype": TORCH_TO_ST[p.dtype], "shape": list(p.shape), "data_offsets": [p.begin, p.end]}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._file = open(self.folder / self.filenames[i], "wb")
        self._file.write(struct.pack("<Q", len(raw)))
        self._file.write(raw)
        self._data_start = 8 + len(raw)
        self._file.truncate(self._data_start + max((p.end for p in self.shards[i]), default=0))
        self._shard = i

    def _close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self.order) or self.order[self._next] != name:
            expected = self.order[self._next] if self._next < len(self.order) else "nothing"
            raise RuntimeError(f"tensors must be written in plan order: expected {expected}, got {name}")
        p = self._plan[name]
        if tuple(tensor.shape) != p.shape or tensor.dtype != p.dtype:
            raise RuntimeError(f"{name}: planned {p.dtype} {list(p.shape)}, got {tensor.dtype} {list(tensor.shape)}")
        if p.shard != self._shard:
            self._open_shard(p.shard)
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        if data.numel():
            self._file.seek(self._data_start + p.begin)
            self._file.write(memoryview(data.numpy()))
        self._next += 1
        if self._next == len(self.order) or self._plan[self.order[self._next]].shard != p.shard:
            self._close()  # shard complete: on disk now

    def finish(self) -> list[str]:
        """Closes the last shard and writes the index when there are several. Returns the files written."""
        if self._next != len(self.order):
            raise RuntimeError(f"only {self._next} of {len(self.order)} tensors were written")
        self._close()
        if len(self.shards) == 1 and not self.order:
            self._open_shard(0)  # an empty model still gets a valid file
            self._close()
        if len(self.filenames) > 1:
            weight_map = {p.name: self.filenames[p.shard] for items in self.shards for p in items}
            total = sum(p.end - p.begin for items in self.shards for p in items)
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (self.folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
            return [*self.filenames, INDEX]
        return list(self.filenames)

    def close(self) -> None:
        self._close()
