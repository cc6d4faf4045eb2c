"""A user's dataset files as they come, read into one record shape.

Layouts (found from each record, so one reader serves them all):
* LLaVA conversations (`.json` list or `.jsonl`): `conversations` (or `messages`) of {from|role, value|content};
  the first human turn is the question (its `<image>` placeholders removed), the first assistant turn after it
  the SFT target, and the answer is the record's `answer` field when it has one, else that assistant turn.
  `image` / `images`: one path or a list of them.
* Flat records, in parquet (Hugging Face `datasets` exports, verl / EasyR1 RL tables) or in JSON / JSONL: the
  question from `question`, `problem`, `prompt` or `query` (a chat-message list, as verl's `prompt`, gives its
  last user message); the answer from `answer`, `ground_truth`, `gt_answer`, `label` or verl's
  `reward_model.ground_truth`; the SFT target from `target`, `response` or `output` (else the answer); images
  from `images`, `image`, `image_path`, `img` or `image_1`..`image_7`, each value a path, base64 (or a data URL),
  bytes, a {bytes, path} struct, or a list of those; options from `options` or `choices` (a list, a JSON list or
  a Python list literal) or lettered columns `A`..`J`; the id from `id`, `question_id`, `qid`, `uid`, `idx`,
  `index` or `pid` (else FILE:ROW); the kind from `kind` or `category`.
`data.columns` maps any of these fields to a column of another name; a mapped column missing from a file is
an error naming the file and the columns it has. A multiple-choice question gets its options listed after it
(unless it lists them itself) and its answer as the option's letter.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from protege.data.schemas import OPTION_LETTERS
from protege.data.validate import DatasetInvalid

SUFFIXES = (".json", ".jsonl", ".parquet")
IMAGE_PLACEHOLDER = re.compile(r"\s*<image>\s*")
HUMAN, ASSISTANT = {"human", "user"}, {"gpt", "assistant", "model"}
NAMES = {
    "id": ("id", "question_id", "qid", "uid", "idx", "index", "pid"),
    "question": ("question", "problem", "prompt", "query"),
    "answer": ("answer", "ground_truth", "gt_answer", "label", "reward_model"),
    "target": ("target", "response", "output"),
    "image": ("images", "image", "image_path", "img"),
    "options": ("options", "choices"),
    "kind": ("kind", "category"),
}
NUMBERED_IMAGES = tuple(f"image_{i}" for i in range(1, 8))
LETTERED = tuple(OPTION_LETTERS)
OPTIONS_HINT = "Answer with the option's letter from the given choices directly."
_LISTS_OPTIONS = re.compile(r"(?:^|\n)\s*\(?A\s*[.):]\s*\S")


@dataclass
class Record:
    """One question as the pipeline reads it; `error` says why a source record gave none."""
    source: str                       # FILE:ROW or FILE:LINE, for messages
    id: str | None = None
    question: str | None = None
    answer: str | None = None
    target: str | None = None
    images: list = field(default_factory=list)  # raw image values, in order
    options: list[str] = field(default_factory=list)
    kind: str = ""
    error: str = ""


def dataset_files(entry: str | Path) -> list[Path]:
    """A file, or every dataset file under a folder (sorted, hidden ones skipped): what a split names."""
    path = Path(entry)
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise DatasetInvalid(f"{path}: a folder with no dataset file in it; expected .json, .jsonl or .parquet "
                                 "files (LLaVA conversations, flat records, parquet tables)")
        return found
    if not path.exists():
        raise DatasetInvalid(f"{path}: file not found")
    if path.suffix.lower() not in SUFFIXES:
        raise DatasetInvalid(f"{path}: unknown layout (suffix {path.suffix or 'none'!r}); expected a .json or "
                             ".jsonl file (LLaVA conversations or flat records) or a .parquet table")
    return [path]


def raw_records(path: Path) -> Iterator[tuple[str, dict | None, str]]:
    """(source label, record or None, why not) for each record of a .json, .jsonl or .parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_records(path)
        return
    raw = path.read_bytes()
    if suffix == ".jsonl":
        for n, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            label = f"{path.name}:{n}"
            try:
                rec = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as exc:
                yield label, None, f"not UTF-8 (byte {exc.start})"
                continue
            except json.JSONDecodeError as exc:
                yield label, None, f"not JSON ({exc.msg})"
                continue
            yield (label, rec, "") if isinstance(rec, dict) else (label, None, "not an object")
        return
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DatasetInvalid(f"{path}: not UTF-8 at byte {exc.start}; expected a UTF-8 JSON list of records") from None
    except json.JSONDecodeError as exc:
        raise DatasetInvalid(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]  # {"data": [...]}, as some exports wrap it
    if not isinstance(data, list):
        raise DatasetInvalid(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for i, rec in enumerate(data):
        label = f"{path.name}:record {i}"
        yield (label, rec, "") if isinstance(rec, dict) else (label, None, "not an object")


def _parquet_records(path: Path) -> Iterator[tuple[str, dict | None, str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for bytes that are not parquet
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DatasetInvalid(f"{path}: not a readable parquet table ({type(exc).__name__}: {first}); expected a "
                             "parquet file") from None
    n = 0
    for batch in table.iter_batches(batch_size=256):  # a large table is never in memory at once
        for rec in batch.to_pylist():
            yield f"{path.name}:row {n}", rec, ""
            n += 1


def file_columns(path: Path) -> set[str] | None:
    """The columns a parquet file declares (None for JSON, whose records each have their own keys)."""
    if path.suffix.lower() != ".parquet":
        return None
    import pyarrow.parquet as pq

    try:
        return set(pq.read_schema(path).names)
    except Exception:
        return None  # raw_records names the file as unreadable


def check_mapping(path: Path, columns: dict[str, str], keys: set[str]) -> None:
    """Every mapped column must be in the file: a typo in data.columns would otherwise read nothing."""
    missing = {f: c for f, c in columns.items() if c not in keys}
    if missing:
        wanted = ", ".join(f"data.columns.{f}: {c!r}" for f, c in missing.items())
        raise DatasetInvalid(f"{path}: no column {', '.join(repr(c) for c in missing.values())} ({wanted}); the "
                             f"file has {', '.join(sorted(keys)) or 'no columns'}")


def _text(value) -> str | None:
    """A scalar as text (numbers as written: 3 -> '3', 2.5 -> '2.5'); None for null and containers."""
    if value is None or isinstance(value, (dict, list, tuple, bytes, bytearray)):
        return None
    if isinstance(value, float):
        if value != value:
            return None
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _message_text(content) -> str | None:
    """A chat message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in content]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def _part_images(messages) -> list:
    """Images given inside chat messages' content parts ({"type": "image", "image": ...} or an image_url)."""
    found = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content", m.get("value")) if isinstance(m, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "image" and part.get("image") is not None:
                found.append(part["image"])
            elif part.get("type") == "image_url" and isinstance(part.get("image_url"), dict):
                found.append(part["image_url"].get("url"))
    return [f for f in found if f is not None]


def _question(value) -> str | None:
    """A question field: text, or a chat-message list (verl's `prompt`), whose last user message is it."""
    if isinstance(value, list):
        users = [m for m in value if isinstance(m, dict) and str(m.get("role", m.get("from", ""))).lower() in HUMAN]
        return _message_text(users[-1].get("content", users[-1].get("value"))) if users else None
    return _text(value)


def _answer(value) -> str | None:
    """An answer field: text, verl's {ground_truth: ...}, or the first of a list of accepted answers."""
    if isinstance(value, dict):
        value = value.get("ground_truth", value.get("answer"))
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return _text(value)


def _options(value) -> list[str] | None:
    """Option texts from a list, a JSON list or a Python list literal; None when it is not a list."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(text)
                break
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
    if isinstance(value, dict):  # {"A": "cat", "B": "dog"}
        value = [value[k] for k in sorted(value)]
    if isinstance(value, (list, tuple)):
        return [t for t in (_text(v) for v in value) if t is not None]
    return None


def _images(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]


def _first(rec: dict, field: str, columns: dict[str, str]):
    if field in columns:
        return rec.get(columns[field])
    for name in NAMES[field]:
        if rec.get(name) is not None:
            return rec[name]
    return None


def _llava_turns(turns) -> tuple[str | None, str | None, str]:
    """(first human turn, first assistant turn after it, why not) of a conversation."""
    if not isinstance(turns, list):
        return None, None, f"'conversations' is a {type(turns).__name__}; expected a list of {{from, value}} turns"
    question = None
    for n, msg in enumerate(turns):
        if not isinstance(msg, dict):
            return None, None, f"conversations[{n}] is a {type(msg).__name__}; expected an object with from, value"
        who = str(msg.get("from", msg.get("role", ""))).lower()
        text = _message_text(msg.get("value", msg.get("content", "")))
        if who in HUMAN and question is None:
            question = text or ""
        elif who in ASSISTANT and question is not None:
            return question, (text or "").strip(), ""
    return None, None, "no human turn followed by an assistant turn"


def normalise(label: str, rec: dict, columns: dict[str, str]) -> Record:
    """One source record as a Record (question still with its options unlisted: see `finish`)."""
    out = Record(label)
    out.id = _text(_first(rec, "id", columns))
    turns = rec.get("conversations", rec.get("messages")) if "question" not in columns else None
    if turns is not None:
        question, reply, why = _llava_turns(turns)
        if why:
            out.error = why
            return out
        out.question, out.target = question, reply
        out.answer = _answer(_first(rec, "answer", columns)) or reply
    else:
        out.question = _question(_first(rec, "question", columns))
        target = _first(rec, "target", columns)
        if target is not None and not isinstance(target, str):  # reported, but the rest is still read
            out.error = (f"column {columns.get('target', 'target')!r} holds {type(target).__name__} {target!r}; "
                         "expected the SFT target as text (or null: the answer)")
            target = None
        out.target = target
        out.answer = _answer(_first(rec, "answer", columns)) or (target if isinstance(target, str) else None)
        if out.question is None:
            names = [columns["question"]] if "question" in columns else [*NAMES["question"], "conversations"]
            out.error = (f"no question: expected one of the columns {', '.join(names)} (or map yours with "
                         f"data.columns.question); the record has {', '.join(sorted(rec)) or 'no fields'}")
            return out
    images = _first(rec, "image", columns)
    out.images = _images(images) if images is not None else [rec[k] for k in NUMBERED_IMAGES if rec.get(k) is not None]
    if not out.images:  # a chat layout may carry its images in the messages' content parts
        out.images = _part_images(turns if turns is not None else _first(rec, "question", columns))
    options = _first(rec, "options", columns)
    if options is not None:
        parsed = _options(options)
        if parsed is None:
            out.error = f"options: expected a list of option texts, got {type(options).__name__}"
            return out
        out.options = parsed
    elif all(k in rec for k in "AB"):  # lettered option columns, as VLMEvalKit and MMBench files have them
        out.options = [t for t in (_text(rec.get(k)) for k in LETTERED) if t]
    out.kind = _text(_first(rec, "kind", columns)) or ""
    return finish(out)


def _letter(answer: str, options: list[str]) -> str | None:
    """The option letter an answer names: 'B', '(B)', 'B.', the option's own text, or else a 0-based index
    (ScienceQA and AI2D give the answer as the option's position)."""
    letters = OPTION_LETTERS[:len(options)]
    m = re.fullmatch(r"\(?([A-Ja-j])[.):]?", answer.strip())
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    matches = [letters[i] for i, o in enumerate(options) if o.strip().lower() == answer.strip().lower()]
    if len(matches) == 1:
        return matches[0]
    if not matches and answer.strip().isdigit() and int(answer) < len(letters):
        return letters[int(answer)]
    return None


def finish(rec: Record) -> Record:
    """The question without image placeholders and with its options listed; a lettered answer."""
    rec.question = IMAGE_PLACEHOLDER.sub(" ", rec.question or "").strip() if rec.question is not None else None
    if rec.options and rec.question:
        if not _LISTS_OPTIONS.search(rec.question):
            listed = "\n".join(f"{OPTION_LETTERS[i]}. {o}" for i, o in enumerate(rec.options[:len(OPTION_LETTERS)]))
            rec.question = f"{rec.question}\n{listed}\n{OPTIONS_HINT}"
        if rec.answer is not None:
            letter = _letter(rec.answer, rec.options)
            if letter is not None:
                rec.answer = letter
    for name in ("answer", "target"):
        value = getattr(rec, name)
        setattr(rec, name, value.strip() if isinstance(value, str) and value.strip() else None)
    return rec


def check_question_column(path: Path, columns: dict[str, str], keys: set[str]) -> None:
    """A table none of whose columns can be the question is in an unknown layout: one error for the file."""
    if "question" in columns or keys & {*NAMES["question"], "conversations", "messages"}:
        return
    raise DatasetInvalid(f"{path}: no question column: expected one of {', '.join(NAMES['question'])} or "
                         f"conversations (or name yours in data.columns.question); the file has "
                         f"{', '.join(sorted(keys)) or 'no columns'}")


def read_file(path: Path, columns: dict[str, str] | None = None) -> list[Record]:
    """Every record of one dataset file, in order; records that give no question carry their `error`."""
    columns = columns or {}
    keys = file_columns(path)
    if keys is not None:
        check_mapping(path, columns, keys)
        check_question_column(path, columns, keys)
    out, seen_keys = [], set()
    for label, rec, why in raw_records(path):
        if rec is None:
            out.append(Record(label, error=why))
            continue
        seen_keys.update(rec)
        out.append(normalise(label, rec, columns))
    if keys is None and columns and out:
        check_mapping(path, columns, seen_keys)
    return out
