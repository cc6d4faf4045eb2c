"""Benchmark files -> `BenchItem`s, for the 14 benchmarks of the RIL paper.

Three families of layout are read; `protege.eval.writers` writes the same ones.

1. VLMEvalKit TSV (every benchmark): columns `index`, `image`, `question`, `answer` (required), `hint`,
   option columns `A`..`J` (empty = absent; the options are the filled ones in letter order), `category`,
   `l2-category` (or `l2_category`), `split`; `image_path` is ignored. `image` is base64, a Python-literal
   list of base64 strings for multi-image questions (MMMU, BLINK, MM-Vet v2), or -- as VLMEvalKit does to
   save space -- the `index` of another row whose image it shares. Per benchmark:
   mathvista: `question_type`, `answer_type`, `precision`, `unit`, `choices` (list literal), `answer_option`,
   `task` (-> category), `skills`; for multi_choice the gold `answer` is the choice text.
   mmmu / mmmu_pro: `question_type` (inferred from the options when absent), `topic_difficulty`.
   mmvet / mmvet_v2: `category` is the comma-joined capability list ("rec,ocr").
   chartqa: `answer` may be a list literal of accepted answers (-> meta["answers"]).
   mmbench / mmbench_cn: circular copies share `index % 1_000_000` (-> group).
   mmstar / realworldqa: options written inside the question are parsed out when no option column is filled.

2. lmms-eval / Hugging Face parquet, one layout per benchmark (images are HF Image structs {bytes, path},
   raw bytes, or lists of those); a folder of parquet shards is read as one file:
   ai2d         lmms-lab/ai2d: question, options (list), answer ("0".."3" -> letter), image; index = row position
   chartqa      lmms-lab/ChartQA: question, answer, type (-> category), image; index = row position
   mathvista    AI4Math/MathVista: pid, question, query, image (path), decoded_image, choices, unit, precision,
                answer, question_type, answer_type, metadata{task -> category, category -> l2_category, skills, ...}
   mmbench(_cn) lmms-lab/MMBench en|cn: index, question, hint, A..D, answer, category, l2-category, image, source,
                comment, split
   mmvet        lmms-lab/MMVet: question_id, image, question, answer, image_source, capability ("rec,ocr")
   mmvet_v2     lmms-lab/MMVet-v2 style: id, question with `<IMG>name.png<IMG>` markers, answer, capability (list),
                added_in, one image column per marker (column named like the marker, with or without the
                extension, e.g. image_0), or an `images` list
   mmmu         MMMU/MMMU: id, question, options (list literal string), image_1..image_7, answer, question_type,
                topic_difficulty (-> difficulty), subfield, img_type; category = subject taken from the id
                ("validation_Art_Theory_3" -> "Art_Theory"); a list-typed answer -> meta["answers"] (a string
                answer stays a string, even one reading "['3', 'three']", as lmms-eval keeps it)
   mmmu_pro     MMMU/MMMU_Pro standard: id, question, options, image_1..image_7, answer, topic_difficulty, subject
   mmstar       Lin-Chen/MMStar: index, question (ending "Options: A: .., B: .."), image, answer, category,
                l2_category
   blink        BLINK-Benchmark/BLINK: idx, question, sub_task (-> category), image_1..image_4, choices, answer "(A)"
   seedbench    lmms-lab/SEED-Bench: question_id, question, choice_a..choice_d, answer, question_type_id (-> category
                name), data_type, data_id, image (list)
   seedbench2_plus  doolayer/SEED-Bench-2-Plus: question_id, question, choice_A..choice_D, answer,
                question_image_type (-> category), question_image_subtype (-> l2_category), image
   realworldqa  lmms-lab/RealWorldQA: question (options as "A. .." lines when it has any), answer, image;
                index = row position

3. JSON: the MM-Vet release `mm-vet.json` ({"v1_0": {imagename, capability, question, answer}}) and MM-Vet v2
   `mm-vet-v2.json` ({"v2_0": {question with <IMG>name<IMG> markers, answer, capability, added_in}}), both
   with their images in `images/` next to the JSON; JSON Lines of the same records (with an `id`) too.

MM-Vet v2 questions are kept as the official grader shows them: each image marker replaced by "<image>".
Everything wrong with a file is reported in one UserFacingError naming the file, rows, index values and
column; nothing is unpickled, list literals are read with ast.literal_eval.
"""
from __future__ import annotations

import ast
import base64
import binascii
import io
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from protege.errors import UserFacingError
from protege.bench.items import BENCHMARKS, BenchItem

LETTERS = "ABCDEFGHIJ"
SHOW = 10
CIRCULAR = 1_000_000
CIRCULAR_BENCHMARKS = ("mmbench", "mmbench_cn")
# benchmarks whose options are always multiple choice with a gold letter (MathVista's gold is the choice text)
LETTER_GOLD = ("ai2d", "mmbench", "mmbench_cn", "mmmu", "mmmu_pro", "mmstar", "blink", "seedbench",
               "seedbench2_plus", "realworldqa")
IMAGE_EXT = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")

EXAMPLE_TSV = {"ai2d": "AI2D_TEST.tsv", "chartqa": "ChartQA_TEST.tsv", "mathvista": "MathVista_MINI.tsv",
               "mmbench": "MMBench_DEV_EN.tsv", "mmbench_cn": "MMBench_DEV_CN.tsv", "mmvet": "MMVet.tsv",
               "mmvet_v2": "MMVet_v2.tsv", "mmmu": "MMMU_DEV_VAL.tsv", "mmmu_pro": "MMMU_Pro_10c.tsv",
               "mmstar": "MMStar.tsv", "blink": "BLINK.tsv", "seedbench": "SEEDBench_IMG.tsv",
               "seedbench2_plus": "SEEDBench2_Plus.tsv", "realworldqa": "RealWorldQA.tsv"}
JSON_NAME = {"mmvet": "mm-vet.json", "mmvet_v2": "mm-vet-v2.json"}

# SEED-Bench's question_type_id, as named in its release (ids 10-12 are the video dimensions)
SEED_TYPES = {1: "Scene Understanding", 2: "Instance Identity", 3: "Instance Attributes", 4: "Instance Location",
              5: "Instances Counting", 6: "Spatial Relation", 7: "Instance Interaction", 8: "Visual Reasoning",
              9: "Text Understanding", 10: "Action Recognition", 11: "Action Prediction",
              12: "Procedure Understanding"}

# what each parquet layout cannot do without (column groups: any one of the alternatives will do)
PARQUET_REQUIRED = {
    "ai2d": ("question", "options", "answer", "image"),
    "chartqa": ("question", "answer", "image"),
    "mathvista": ("pid", "question", "answer", "question_type", "answer_type", "decoded_image|image"),
    "mmbench": ("index", "question", "answer", "image"),
    "mmbench_cn": ("index", "question", "answer", "image"),
    "mmvet": ("question_id", "question", "answer", "image"),
    "mmvet_v2": ("id|question_id", "question", "answer"),
    "mmmu": ("id", "question", "options", "answer", "image_1"),
    "mmmu_pro": ("id", "question", "options", "answer", "image_1"),
    "mmstar": ("index", "question", "answer", "image"),
    "blink": ("idx", "question", "choices", "answer", "image_1"),
    "seedbench": ("question_id", "question", "choice_a", "choice_b", "answer", "image"),
    "seedbench2_plus": ("question_id", "question", "choice_A", "choice_B", "answer", "image"),
    "realworldqa": ("question", "answer", "image"),
}
TSV_REQUIRED = ("index", "image", "question", "answer")

# problem kind -> (column a user knows, what was expected)
PROBLEMS = {
    "image": ("image", "an image that decodes (base64 / bytes / file of a PNG or JPEG that PIL can open)"),
    "question": ("question", "a non-empty question"),
    "answer": ("answer", "a gold answer letter naming one of the row's filled options"),
    "choice": ("answer", "a gold answer equal to one of the row's choices"),
    "index": ("index", "index values unique within the file"),
    "no_index": ("index", "a non-empty index"),
    "gold": ("answer", "a non-empty gold answer"),
    "parse": ("options / choices", "a readable list literal"),
}


@dataclass
class _Row:
    item: BenchItem
    raw_images: list = field(default_factory=list)
    image_column: str = "image"
    problems: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail)


class _Problems:
    def __init__(self, source: str):
        self.source = source
        self.found: dict[str, list[str]] = defaultdict(list)

    def add(self, kind: str, row: int, index: str, detail: str = "") -> None:
        self.found[kind].append(f"row {row} (index {index})" + (f": {detail}" if detail else ""))

    def raise_if_any(self, name: str) -> None:
        if not self.found:
            return
        lines = []
        for kind, rows in self.found.items():
            column, expected = PROBLEMS[kind]
            more = f"; and {len(rows) - SHOW} more" if len(rows) > SHOW else ""
            lines.append(f"  column '{column}': {len(rows)} row(s) fail, expected {expected}: "
                         + "; ".join(rows[:SHOW]) + more)
        raise UserFacingError(f"{self.source}: the {name} benchmark file has problems:\n" + "\n".join(lines))


# ---------------------------------------------------------------------------------------------- small parsers

def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else (str(int(value)) if value.is_integer() else str(value))
    return str(value)


def _literal_list(value) -> list | None:
    """A list given as a list, or as the Python/JSON literal of one; None when it is neither."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if value is None or not isinstance(value, str):
        return None
    s = value.strip()
    if not s:
        return []
    if not s.startswith("["):
        return None
    try:
        out = ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return list(out) if isinstance(out, (list, tuple)) else None


def _precision(value) -> int | None:
    try:
        p = float(value)
    except (TypeError, ValueError):
        return None
    return int(p) if not math.isnan(p) and p.is_integer() else None


def _letter(answer: str) -> str:
    """BLINK-style "(A)" and "A." golds, lower case and padding included ("b", " C ", "(d)") -> "A".. "J",
    as the harnesses normalise them (upper-casing and stripping the gold before comparing)."""
    m = re.fullmatch(r"\s*\(?([A-Ja-j])\)?\.?\s*", answer or "")
    return m.group(1).upper() if m else (answer or "").strip()


def _capabilities(value) -> list[str]:
    listed = _literal_list(value)
    if listed is not None:
        return [str(c).strip() for c in listed if str(c).strip()]
    return [c.strip() for c in _text(value).split(",") if c.strip()]


def mmstar_options(question: str) -> tuple[str, dict[str, str]]:
    """Split MMStar's "...\\nOptions: A: x, B: y, C: z" into the question and its options.

    Each letter's marker is searched after the previous one, so commas inside an option's text survive."""
    at = question.rfind("Options:")
    if at < 0:
        return question, {}
    body = question[at + len("Options:"):]
    starts = []
    pos = 0
    for i, letter in enumerate(LETTERS):
        # later letters need a comma or line break before them, so "vitamin B." inside an option is text
        pat = rf"\s*{letter}\s*[:.]\s*" if i == 0 else rf"(?:,|\n)\s*{letter}\s*[:.]\s+"
        m = re.compile(pat).search(body, pos) if i else re.compile(pat).match(body, pos)
        if not m:
            break
        starts.append((letter, m.start(), m.end()))
        pos = m.end()
    if len(starts) < 2:
        return question, {}
    options = {}
    for k, (letter, _, end) in enumerate(starts):
        stop = starts[k + 1][1] if k + 1 < len(starts) else len(body)
        options[letter] = body[end:stop].strip()
    return question[:at].rstrip(), options


_LINE_OPTION = re.compile(r"^\s*\(?([A-J])[.)]\s+(.*\S)\s*$")


def line_options(question: str) -> tuple[str, dict[str, str]]:
    """Options listed one per line as "A. text" (or "(A) text"), consecutive letters from A; else none."""
    lines = question.split("\n")
    for start, line in enumerate(lines):
        m = _LINE_OPTION.match(line)
        if not m or m.group(1) != "A":
            continue
        options, end = {}, start
        while end < len(lines):
            m = _LINE_OPTION.match(lines[end])
            if not m or m.group(1) != LETTERS[len(options)]:
                break
            options[m.group(1)] = m.group(2)
            end += 1
        if len(options) >= 2:
            rest = lines[:start] + lines[end:]
            return "\n".join(rest).strip(), options
    return question, {}


def split_markers(question: str) -> tuple[str, list[str]]:
    """MM-Vet v2's `<IMG>name.png<IMG>` (or `<IMG><name.png>`) markers -> ("...<image>...", [name, ...])."""
    if "<IMG>" not in question:
        return question, []
    text, names = [], []
    for piece in question.split("<IMG>"):
        s = piece.strip()
        m = re.match(r"<([^<>\s]+)>(.*)\Z", s, re.DOTALL)
        if m and m.group(1).lower().endswith(IMAGE_EXT):
            names.append(m.group(1))
            text.append("<image>")
            text.append(m.group(2))
        elif s and "\n" not in s and " " not in s and s.lower().endswith(IMAGE_EXT):
            names.append(s)
            text.append("<image>")
        else:
            text.append(piece)
    return "".join(text), names


# ---------------------------------------------------------------------------------------------- images

def _pil_ok(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format == "JPEG":
                im.draft("RGB", (64, 64))  # decodes every block at 1/8 scale: catches truncation, 8x cheaper
            im.load()
        return True
    except Exception:  # noqa: BLE001 -- PIL raises OSError, SyntaxError, ValueError, struct.error... on bad input
        return False


def _image_bytes(value, base_dir: Path) -> tuple[bytes | None, str]:
    """Encoded bytes of one image given as a HF struct, raw bytes, a path, or base64; (None, why) when not."""
    if isinstance(value, dict):
        if value.get("bytes"):
            value = value["bytes"]
        elif value.get("path"):
            value = value["path"]
        else:
            return None, "no image"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), ""
    if isinstance(value, Path):
        return (value.read_bytes(), "") if value.is_file() else (None, f"image file not found: {value}")
    if value is None or not isinstance(value, str) or not value.strip():
        return None, "no image"
    s = value.strip()
    if len(s) < 512 and s.lower().endswith(IMAGE_EXT):
        p = Path(s) if Path(s).is_absolute() else base_dir / s
        if p.is_file():
            return p.read_bytes(), ""
        return None, f"image file not found: {p}"
    try:
        return base64.b64decode("".join(s.split()), validate=True), ""
    except (binascii.Error, ValueError):
        if s.isdigit():  # VLMEvalKit's pointer to another row's image
            return None, f"refers to the image of index {s}, which is not in the file"
        return None, "not valid base64"


# ---------------------------------------------------------------------------------------------- TSV

def _read_tsv(name: str, path: Path) -> list[_Row]:
    import pandas as pd

    try:
        # all text, nothing turned into NaN: "None" / "NA" are real answers in some benchmarks
        df = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_filter=False)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise UserFacingError(f"{path}: not a readable tab-separated file ({exc}); expected the VLMEvalKit TSV "
                              f"for {name} (e.g. {EXAMPLE_TSV[name]})") from None
    columns = [str(c) for c in df.columns]
    missing = [c for c in TSV_REQUIRED if c not in columns]
    if missing:
        raise UserFacingError(f"{path}: missing column(s) {missing} for the VLMEvalKit TSV layout of {name}; "
                              f"expected {list(TSV_REQUIRED)} (+ optional hint, A..J, category, l2-category, "
                              f"split); present: {columns}")
    records = df.to_dict("records")
    by_index = {r["index"].strip(): r["image"] for r in records}
    rows = []
    for n, rec in enumerate(records, start=1):
        rows.append(_tsv_row(name, rec, n, str(path), by_index))
    return rows


# an index, not base64: an encoded image is never a short run of digits (PNG starts "iVBOR", JPEG "/9j/")
_POINTER = re.compile(r"-?\d{1,20}")


def _follow_image_pointer(image: str, by_index: dict) -> tuple[str, str]:
    """VLMEvalKit stores a repeated image once and puts the index of the row that holds it in the copies'
    cells: (the image the cell stands for, "" or why it stands for none)."""
    seen: list[str] = []
    s = image.strip()
    while 0 < len(s) <= 64 and (s in by_index or _POINTER.fullmatch(s)):
        if s not in by_index:
            head = f"refers to index {seen[0]}, whose image refers to index {s}" if seen else f"refers to index {s}"
            return "", f"its image {head}, which is not in the file"
        target = by_index[s].strip()
        if target == s:  # a row pointing at itself holds no image
            return "", f"its image refers to index {s}, whose row holds no image of its own"
        if s in seen:
            return "", f"its image refers to index {seen[0]}, and the pointers from there run in a circle"
        seen.append(s)
        image, s = by_index[s], target
    return image, ""


def _tsv_row(name: str, rec: dict, n: int, source: str, by_index: dict) -> _Row:
    def get(column: str) -> str:
        return rec.get(column, "") or ""

    index = get("index").strip()
    image, pointer_problem = _follow_image_pointer(get("image"), by_index)
    listed = _literal_list(image) if image.lstrip().startswith("[") else None
    raw_images = listed if listed is not None else ([image] if image.strip() else [])
    options = {L: get(L) for L in LETTERS if get(L).strip()}
    item = BenchItem(benchmark=name, index=index, question=get("question"), images=[],
                     answer=get("answer").strip(), options=options, hint=get("hint"),
                     category=get("category"), l2_category=get("l2-category") or get("l2_category"),
                     difficulty=get("topic_difficulty") or get("difficulty"), source=source, row=n)
    if get("split"):
        item.meta["split"] = get("split")
    row = _Row(item, raw_images)
    if pointer_problem:
        row.raw_images, row.problems = [], [("image", pointer_problem)]
    if name == "mathvista":
        # a TSV may list the choices in the option columns instead of a `choices` literal
        choices = get("choices") or (list(options.values()) if options else "")
        _mathvista(row, question_type=get("question_type"), answer_type=get("answer_type"),
                   precision=get("precision"), unit=get("unit"), choices=choices,
                   answer_option=get("answer_option"), skills=get("skills"))
        item.category = get("task") or item.category
        for key in ("grade", "context", "source", "language", "query"):
            if get(key):
                item.meta[key] = get(key)
    elif name == "chartqa":
        answers = _literal_list(item.answer) if item.answer.startswith("[") else None
        if answers:
            item.meta["answers"] = [_text(a) for a in answers]
            item.answer = item.meta["answers"][0]
    elif name in ("mmmu", "mmmu_pro"):
        item.meta["question_type"] = get("question_type") or ("multiple-choice" if options else "open")
        for key in ("subfield", "img_type", "id"):
            if get(key):
                item.meta[key] = get(key)
    for key in ("source", "comment") if name in CIRCULAR_BENCHMARKS else ():
        if get(key):
            item.meta[key] = get(key)
    _finish(row)
    return row


# ---------------------------------------------------------------------------------------------- shared rules

def _mathvista(row: _Row, question_type, answer_type, precision, unit, choices, answer_option="", skills=None):
    item = row.item
    listed = _literal_list(choices) if choices is not None else None
    if listed is None and isinstance(choices, str) and choices.strip():
        row.problems.append(("parse", f"choices {choices[:60]!r} is not a list literal"))
    choices = [_text(c) for c in (listed or [])]
    qtype = _text(question_type) or ("multi_choice" if choices else "free_form")
    item.meta.update(question_type=qtype, answer_type=_text(answer_type) or "text",
                     precision=_precision(precision), unit=_text(unit), choices=choices)
    sk = _literal_list(skills) if skills is not None else None
    if sk is None and isinstance(skills, str) and skills.strip():
        sk = [skills.strip()]
    if sk:
        item.meta["skills"] = [str(s) for s in sk]
    if qtype == "multi_choice" and choices:
        item.options = {LETTERS[i]: c for i, c in enumerate(choices[:len(LETTERS)])}
        if item.answer not in choices:
            letter = _letter(_text(answer_option)) or _letter(item.answer)
            if letter in item.options and (answer_option or len(item.answer.strip()) <= 3):
                item.answer = item.options[letter]  # a file that gives the gold as a letter
        if item.answer in choices:
            item.meta["answer_option"] = LETTERS[choices.index(item.answer)]
        else:
            row.problems.append(("choice", f"answer {item.answer!r}, choices {choices}"))
    else:
        item.options = {}


def _finish(row: _Row) -> None:
    """Rules every layout shares: option parsing from the text, gold letters, groups, empty questions."""
    item, name = row.item, row.item.benchmark
    if name in ("mmvet", "mmvet_v2"):  # capabilities from their own field, else the TSV's category column
        caps = item.meta.get("capability")
        item.meta["capability"] = _capabilities(item.category if caps is None else caps)
        item.category = ",".join(item.meta["capability"])
    if name == "mmstar" and not item.options:
        item.question, item.options = mmstar_options(item.question)
    if name == "realworldqa" and not item.options:
        _, opts = line_options(item.question)
        if opts:  # the question keeps its option lines: RealWorldQA's prompt is the question as given
            item.options = opts
            by_text = {v.strip().lower(): k for k, v in opts.items()}
            if _letter(item.answer) not in opts and item.answer.strip().lower() in by_text:
                item.answer = by_text[item.answer.strip().lower()]
    if name in LETTER_GOLD and item.options:
        item.answer = _letter(item.answer)
        if item.answer not in item.options:
            shown = ",".join(item.options) or "none"
            row.problems.append(("answer", f"answer {item.answer!r} but the options are {shown}"))
    elif name in LETTER_GOLD and name not in ("mmmu", "realworldqa"):
        row.problems.append(("answer", f"answer {item.answer!r} but no option is filled"))
    if name in CIRCULAR_BENCHMARKS:
        try:
            item.group = str(int(float(item.index)) % CIRCULAR)
        except ValueError:
            item.group = item.index
    if not item.question.strip():
        row.problems.append(("question", "empty"))


# ---------------------------------------------------------------------------------------------- parquet

def _parquet_records(path: Path) -> tuple[list[dict], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    try:
        tables = [pq.read_table(f) for f in files]
    except (pa.ArrowException, OSError) as exc:
        raise UserFacingError(f"{path}: not a readable parquet file ({exc})") from None
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    return table.to_pylist(), list(table.column_names)


def _check_columns(name: str, path: Path, columns: list[str], required, layout: str) -> None:
    missing = [group.replace("|", " or ") for group in required
               if not any(alt in columns for alt in group.split("|"))]
    if missing:
        raise UserFacingError(f"{path}: missing column(s) {missing} for the {layout} layout of {name}; expected "
                              f"{[g.replace('|', ' or ') for g in required]}; present: {columns}")


def _numbered_images(rec: dict, prefix: str = "image_", first: int = 1, last: int = 7) -> list:
    return [rec[f"{prefix}{k}"] for k in range(first, last + 1) if rec.get(f"{prefix}{k}") is not None]


def _parquet_row(name: str, rec: dict, n: int, source: str, columns: list[str]) -> _Row:
    def g(column: str) -> str:
        return _text(rec.get(column))

    item = BenchItem(benchmark=name, index=str(n - 1), question=g("question"), images=[], answer=g("answer").strip(),
                     source=source, row=n)
    row = _Row(item)
    raw = rec.get("image")
    row.raw_images = list(raw) if isinstance(raw, (list, tuple)) else ([raw] if raw is not None else [])
    if name == "ai2d":
        opts = _literal_list(rec.get("options")) or []
        item.options = {LETTERS[i]: _text(o) for i, o in enumerate(opts[:len(LETTERS)])}
        a = item.answer
        item.answer = LETTERS[int(a)] if a.isdigit() and int(a) < len(LETTERS) else a
        if g("index") or g("id"):
            item.index = g("index") or g("id")
    elif name == "chartqa":
        item.category = g("type")
        answers = rec.get("answer")
        if isinstance(answers, (list, tuple)):
            item.meta["answers"] = [_text(a) for a in answers]
            item.answer = item.meta["answers"][0] if answers else ""
    elif name == "mathvista":
        item.index = g("pid")
        row.raw_images = [rec["decoded_image"]] if rec.get("decoded_image") is not None else [rec.get("image")]
        row.image_column = "decoded_image" if "decoded_image" in columns else "image"
        _mathvista(row, rec.get("question_type"), rec.get("answer_type"), rec.get("precision"), rec.get("unit"),
                   rec.get("choices"), "", (rec.get("metadata") or {}).get("skills"))
        md = rec.get("metadata") or {}
        item.category, item.l2_category = _text(md.get("task")), _text(md.get("category"))
        for key in ("grade", "context", "source", "language", "split"):
            if md.get(key):
                item.meta[key] = _text(md.get(key))
        if g("query"):
            item.meta["query"] = g("query")
    elif name in CIRCULAR_BENCHMARKS:
        item.index, item.hint = g("index"), g("hint")
        item.options = {L: g(L) for L in LETTERS if g(L).strip()}
        item.category, item.l2_category = g("category"), g("l2-category") or g("l2_category")
        for key in ("source", "comment", "split"):
            if g(key):
                item.meta[key] = g(key)
    elif name == "mmvet":
        item.index = g("question_id")
        item.meta["capability"] = rec.get("capability")
        if g("image_source"):
            item.meta["image_source"] = g("image_source")
    elif name == "mmvet_v2":
        item.index = g("id") or g("question_id")
        item.question, names = split_markers(item.question)
        item.meta["capability"] = rec.get("capability")
        if g("added_in"):
            item.meta["added_in"] = g("added_in")
        row.raw_images, row.image_column = _v2_images(rec, names)
    elif name in ("mmmu", "mmmu_pro"):
        item.index = g("id")
        row.raw_images, row.image_column = _numbered_images(rec), "image_1..image_7"
        listed = _literal_list(rec.get("options"))
        if listed is None:
            row.problems.append(("parse", f"options {g('options')[:60]!r} is not a list literal"))
            listed = []
        item.options = {LETTERS[i]: _text(o) for i, o in enumerate(listed[:len(LETTERS)])}
        item.difficulty = g("topic_difficulty")
        gold = rec.get("answer")
        if isinstance(gold, (list, tuple)):  # a list-typed answer column: every element is an accepted answer
            item.meta["answers"] = [_text(a) for a in gold]  # (item.answer keeps the list's text, as before)
        if name == "mmmu":
            m = re.fullmatch(r"(?:dev|validation|test)_(.+)_\d+", item.index)
            item.category = g("subject") or (m.group(1) if m else "")
            item.meta["question_type"] = g("question_type") or ("multiple-choice" if item.options else "open")
        else:
            item.category = g("subject")
            item.meta["question_type"] = "multiple-choice"
        if item.meta["question_type"] == "open":
            item.options = {}
        for key in ("subfield", "img_type"):
            if g(key):
                item.meta[key] = g(key)
    elif name == "mmstar":
        item.index = g("index")
        item.category, item.l2_category = g("category"), g("l2_category") or g("l2-category")
    elif name == "blink":
        item.index, item.category = g("idx"), g("sub_task")
        row.raw_images, row.image_column = _numbered_images(rec, last=4), "image_1..image_4"
        item.options = {LETTERS[i]: _text(c) for i, c in enumerate((_literal_list(rec.get("choices")) or [])[:10])}
    elif name == "seedbench":
        item.index = g("question_id")
        item.options = {L: g(f"choice_{L.lower()}") for L in "ABCD" if g(f"choice_{L.lower()}").strip()}
        tid = g("question_type_id")
        item.category = SEED_TYPES.get(int(tid), tid) if tid.isdigit() else tid
        for key in ("question_type_id", "data_type", "data_id"):
            if g(key):
                item.meta[key] = g(key)
    elif name == "seedbench2_plus":
        item.index = g("question_id")
        item.options = {L: g(f"choice_{L}") for L in "ABCD" if g(f"choice_{L}").strip()}
        item.category, item.l2_category = g("question_image_type"), g("question_image_subtype")
    elif name == "realworldqa" and (g("index") or g("id")):
        item.index = g("index") or g("id")
    _finish(row)
    return row


def _v2_images(rec: dict, names: list[str]) -> tuple[list, str]:
    if names:
        found = []
        for nm in names:
            stem = nm.rsplit(".", 1)[0]
            found.append(rec.get(nm) if rec.get(nm) is not None else rec.get(stem))
        if all(f is not None for f in found):
            return found, ", ".join(names)
    if isinstance(rec.get("images"), (list, tuple)):
        return list(rec["images"]), "images"
    numbered = _numbered_images(rec, first=0, last=63)
    return numbered or ([rec["image"]] if rec.get("image") is not None else []), "image_0..image_N"


# ---------------------------------------------------------------------------------------------- JSON

def _read_json(name: str, path: Path) -> list[_Row]:
    if name not in JSON_NAME:
        raise UserFacingError(f"{path}: {name} has no JSON layout; only mmvet (mm-vet.json) and mmvet_v2 "
                              f"(mm-vet-v2.json) do. Use the VLMEvalKit TSV (e.g. {EXAMPLE_TSV[name]}) or the "
                              f"lmms-eval parquet")
    if path.is_dir():
        raise UserFacingError(f"{path}: a folder without {JSON_NAME[name]}; place the MM-Vet release there "
                              f"({JSON_NAME[name]} with its images/ folder)")
    raw = path.read_bytes()
    try:
        if path.suffix == ".jsonl":
            records = []
            for k, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise UserFacingError(f"{path}: line {k} is not JSON ({exc.msg})") from None
            entries = [(str(r.get("id", r.get("question_id", r.get("index", "")))), r) for r in records
                       if isinstance(r, dict)]
        else:
            data = json.loads(raw.decode("utf-8"))
            if isinstance(data, dict):
                entries = [(str(k), v) for k, v in data.items()]
            elif isinstance(data, list):
                entries = [(str(r.get("id", r.get("question_id", ""))), r) for r in data if isinstance(r, dict)]
            else:
                raise UserFacingError(f"{path}: expected a JSON object of questions keyed by id, "
                                      f"got {type(data).__name__}")
    except UnicodeDecodeError as exc:
        raise UserFacingError(f"{path}: not UTF-8 at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise UserFacingError(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    bad = [k for k, v in entries if not isinstance(v, dict) or "question" not in v or "answer" not in v]
    if bad:
        raise UserFacingError(f"{path}: {len(bad)} entr(ies) lack 'question' or 'answer' (e.g. {bad[:SHOW]}); "
                              f"expected {{id: {{question, answer, capability{', imagename' * (name == 'mmvet')}}}}}")
    images_dir = path.parent / "images"
    rows = []
    for n, (key, rec) in enumerate(entries, start=1):
        item = BenchItem(benchmark=name, index=key, question=_text(rec.get("question")), images=[],
                         answer=_text(rec.get("answer")).strip(), source=str(path), row=n)
        item.meta["capability"] = rec.get("capability")
        item.question, names = split_markers(item.question)
        if rec.get("added_in"):
            item.meta["added_in"] = _text(rec["added_in"])
        if not names and rec.get("imagename"):
            names = [_text(rec["imagename"])]
        raw = [images_dir / nm for nm in names]
        row = _Row(item, raw, "imagename" if name == "mmvet" else "question (<IMG> markers)")
        _finish(row)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- entry point

def _format_of(path: Path, fmt: str | None) -> str:
    if fmt:
        fmt = fmt.lower().lstrip(".")
        if fmt == "jsonl":
            return "json"
        if fmt not in ("tsv", "parquet", "json"):
            raise UserFacingError(f"{path}: unknown benchmark format {fmt!r}; expected tsv, parquet or json")
        return fmt
    if path.is_dir():
        if any(path.rglob("*.parquet")):
            return "parquet"
        raise UserFacingError(f"{path}: a folder without parquet files; point at the benchmark's TSV, parquet "
                              f"or JSON file")
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".parquet"):
        return suffix[1:]
    if suffix in (".json", ".jsonl"):
        return "json"
    raise UserFacingError(f"{path}: cannot tell the format from the suffix {suffix!r}; use .tsv (VLMEvalKit), "
                          f".parquet (lmms-eval / Hugging Face) or .json (MM-Vet release), or pass fmt")


def _missing_file(name: str, path: Path) -> UserFacingError:
    extra = f", or the MM-Vet release ({JSON_NAME[name]} with its images/ folder)" if name in JSON_NAME else ""
    return UserFacingError(f"{path}: benchmark file not found; place the VLMEvalKit TSV (e.g. {EXAMPLE_TSV[name]}) "
                           f"or the lmms-eval parquet for {name}{extra} at {path}, or set its path in params.yaml "
                           f"under evaluate.benchmarks")


def read_benchmark(name: str, path: str | Path, fmt: str | None = None) -> list[BenchItem]:
    """Every question of one benchmark file, images decoded to bytes; all problems raised together."""
    if name not in BENCHMARKS:
        raise UserFacingError(f"unknown benchmark {name!r}; expected one of {', '.join(BENCHMARKS)}")
    path = Path(path)
    if not path.exists():
        raise _missing_file(name, path)
    if path.is_dir() and name in JSON_NAME and (path / JSON_NAME[name]).is_file() and fmt in (None, "json"):
        path = path / JSON_NAME[name]
    fmt = _format_of(path, fmt)
    if fmt == "tsv":
        rows = _read_tsv(name, path)
    elif fmt == "parquet":
        records, columns = _parquet_records(path)
        _check_columns(name, path, columns, PARQUET_REQUIRED[name], "lmms-eval parquet")
        rows = [_parquet_row(name, rec, n, str(path), columns) for n, rec in enumerate(records, start=1)]
    else:
        rows = _read_json(name, path)
    return _validate(name, path, rows)


def _validate(name: str, path: Path, rows: list[_Row]) -> list[BenchItem]:
    if not rows:
        raise UserFacingError(f"{path}: the {name} benchmark file has no rows (a header only?); expected at "
                              "least one question")
    problems = _Problems(str(path))
    base_dir = path if path.is_dir() else path.parent
    decoded: dict = {}
    for row in rows:
        item = row.item
        for kind, detail in row.problems:
            problems.add(kind, item.row, item.index, detail)
        if not str(item.index).strip():
            problems.add("no_index", item.row, item.index)
        if not str(item.answer).strip() and not any(k in ("answer", "choice") for k, _ in row.problems):
            problems.add("gold", item.row, item.index)
        if not row.raw_images and not any(k == "image" for k, _ in row.problems):
            problems.add("image", item.row, item.index, f"no image in column '{row.image_column}'")
        for k, raw in enumerate(row.raw_images):
            key = raw if isinstance(raw, (str, bytes)) else None
            if key is not None and key in decoded:
                data, why = decoded[key]
            else:
                data, why = _image_bytes(raw, base_dir)
                if data is not None and not _pil_ok(data):
                    data, why = None, "PIL cannot open it"
                if key is not None:
                    decoded[key] = (data, why)
            if data is None:
                which = f"image {k + 1} of {len(row.raw_images)}" if len(row.raw_images) > 1 else "image"
                problems.add("image", item.row, item.index, f"{which} in column '{row.image_column}': {why}")
            else:
                item.images.append(data)
    rows_of = defaultdict(list)
    for row in rows:
        rows_of[row.item.index].append(row.item.row)
    for row in rows:
        if len(rows_of[row.item.index]) > 1:
            others = [str(n) for n in rows_of[row.item.index] if n != row.item.row]
            problems.add("index", row.item.row, row.item.index, f"also on row(s) {', '.join(others[:5])}")
    problems.raise_if_any(name)
    return [r.item for r in rows]
