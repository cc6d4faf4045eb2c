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
import codecs
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
    """(source label, record or None, why not) for each record of a .json, .jsonl or .parquet file, read as
    it goes: a file of any size holds one record (or one parquet batch) in memory at a time. An error about
    the whole file (not UTF-8, not JSON) is raised where it is found, after the records before it."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet_records(path)
    elif suffix == ".jsonl":
        yield from _jsonl_records(path)
    else:
        for i, rec in enumerate(_json_array(path)):
            label = f"{path.name}:record {i}"
            yield (label, rec, "") if isinstance(rec, dict) else (label, None, "not an object")


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict | None, str]]:
    n = 0
    with path.open("rb") as f:
        for chunk in f:  # split at b"\n" only: splitlines() numbers lone b"\r" endings as the whole file did
            for line in chunk.splitlines():
                n += 1
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


def _probe(text: str) -> tuple[str, int]:
    """json's own (message, position) for a small bad document: its wording differs between Python versions."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc.msg, exc.pos
    raise AssertionError(text)


_ARRAY_TRAILING = _probe("[1,]")       # (message, 2: at the comma | 3: at the bracket)
_OBJECT_TRAILING = _probe('{"a":1,}')  # (message, 6 | 7)
_WS = re.compile(r"[ \t\n\r]*")
_MARGIN = 64  # characters past a parse error or a bare number that prove the buffer did not just end there


class _JsonText:
    """A UTF-8 JSON file's text, decoded chunk by chunk, that a parser walks with `pos`: what was parsed is
    dropped (its newlines counted, for json's line numbers), so memory holds the current value and a chunk."""

    def __init__(self, path: Path, chunk: int = 1 << 20):
        self.path, self.chunk = path, chunk
        self.file = path.open("rb")
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.lines, self.read_bytes, self.eof = "", 0, 0, 0, False
        self.decode = json.JSONDecoder().raw_decode

    def close(self) -> None:
        self.file.close()

    def more(self, size: int | None = None) -> bool:
        """Reads on; False at the end of the file."""
        if self.eof:
            return False
        if self.pos > len(self.buf) // 2:
            self.lines += self.buf.count("\n", 0, self.pos)
            self.buf, self.pos = self.buf[self.pos:], 0
        data = self.file.read(size or self.chunk)
        self.eof = not data
        try:
            self.buf += self.decoder.decode(data, final=self.eof)
        except UnicodeDecodeError as exc:
            # exc.object is the decoder's held-back bytes followed by `data`
            at = self.read_bytes + len(data) - len(exc.object) + exc.start
            raise DatasetInvalid(f"{self.path}: not UTF-8 at byte {at}; expected a UTF-8 JSON list of records"
                                 ) from None
        self.read_bytes += len(data)
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ('' at the end), `pos` on it."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                if self.pos == 0 and self.lines == 0 and self.buf[0] == "\ufeff":
                    self.fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0)
                return self.buf[self.pos]
            if not self.more():
                return ""

    def value(self):
        """The JSON value at `pos` (after `peek`), read on until the buffer holds all of it."""
        size = self.chunk
        while True:
            try:
                obj, end = self.decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos + _MARGIN >= len(self.buf)
                if cut and self.more(size):
                    size *= 2  # one large value: doubling keeps the re-parses linear in its size
                    continue
                self.fail(exc.msg, exc.pos)
            if isinstance(obj, (dict, list, str)) or end + _MARGIN < len(self.buf) or self.eof:
                self.pos = end
                return obj
            self.more(size)  # a bare number may go on past the buffer ("12" of "12.5")

    def fail(self, msg: str, pos: int):
        line = self.lines + self.buf.count("\n", 0, pos) + 1
        while self.more():  # the whole file was checked for UTF-8 before its JSON: that error comes first
            self.pos = len(self.buf)
        raise DatasetInvalid(f"{self.path}: not valid JSON at line {line}: {msg}")

    def trailing(self, comma: int, probe: tuple[str, int], before: str) -> None:
        """A closing bracket right after a comma, reported as json reports it (at the comma or at the bracket:
        `probe` says which, its comma being at len(before))."""
        self.fail(probe[0], comma if probe[1] == len(before) else self.pos)


def _json_array(path: Path, chunk: int = 1 << 20) -> Iterator:
    """The records of a JSON list (or of {"data": [...]}, as some exports wrap it), one at a time, with
    json.loads' messages for a file that is not JSON, and the same error as before for one that is no list."""
    text = _JsonText(path, chunk)
    try:
        first = text.peek()
        if first == "[":
            yield from _array_items(text)
            found = "list"
        elif first == "{":
            found = yield from _wrapper_items(text)
        else:
            found = type(text.value()).__name__
        if text.peek():
            text.fail("Extra data", text.pos)
        if found != "list":
            raise DatasetInvalid(f"{path}: expected a JSON list of records, got {found}")
    finally:
        text.close()


def _array_items(text: _JsonText) -> Iterator:
    text.pos += 1  # past "["
    if text.peek() == "]":
        text.pos += 1
        return
    while True:
        yield text.value()
        c = text.peek()
        if c == "]":
            text.pos += 1
            return
        if c != ",":
            text.fail("Expecting ',' delimiter", text.pos)
        comma = text.pos
        text.pos += 1
        if text.peek() == "]":
            text.trailing(comma, _ARRAY_TRAILING, "[1")
        # anything else that is no value fails in text.value() as json.loads fails there


def _wrapper_items(text: _JsonText) -> Iterator:
    """The items of an object's `data` list, streamed; the object's other values are read and dropped.
    Returns 'list' when there was such a list, else 'dict' (what the file is, for the error)."""
    text.pos += 1  # past "{"
    found = "dict"
    if text.peek() == "}":
        text.pos += 1
        return found
    while True:
        if text.peek() != '"':
            text.fail("Expecting property name enclosed in double quotes", text.pos)
        key = text.value()
        if text.peek() != ":":
            text.fail("Expecting ':' delimiter", text.pos)
        text.pos += 1
        if key == "data" and found == "dict" and text.peek() == "[":
            yield from _array_items(text)
            found = "list"
        else:
            text.peek()
            text.value()
        c = text.peek()
        if c == "}":
            text.pos += 1
            return found
        if c != ",":
            text.fail("Expecting ',' delimiter", text.pos)
        comma = text.pos
        text.pos += 1
        if text.peek() == "}":
            text.trailing(comma, _OBJECT_TRAILING, '{"a":1')


def _parquet_records(path: Path) -> Iterator[tuple[str, dict | None, str]]:
    import pyarrow.parquet as pq

    try:
        # pre-buffering (pyarrow's default) keeps every row group read so far: a 1 GB table of embedded images
        # held 700 MB; a buffered stream holds a page or so per column, whatever the row groups' size
        table = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
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


def iter_file(path: Path, columns: dict[str, str] | None = None) -> Iterator[Record]:
    """Every record of one dataset file, in order, read as it goes; records that give no question carry
    their `error`. A JSON file's mapped column that no record has is an error raised after its last record."""
    columns = columns or {}
    keys = file_columns(path)
    if keys is not None:
        check_mapping(path, columns, keys)
        check_question_column(path, columns, keys)
    seen_keys, any_record = set(), False
    for label, rec, why in raw_records(path):
        any_record = True
        if rec is None:
            yield Record(label, error=why)
            continue
        seen_keys.update(rec)
        yield normalise(label, rec, columns)
    if keys is None and columns and any_record:
        check_mapping(path, columns, seen_keys)


def read_file(path: Path, columns: dict[str, str] | None = None) -> list[Record]:
    """Every record of one dataset file, in order (`iter_file` as a list)."""
    return list(iter_file(path, columns))
