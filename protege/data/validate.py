"""Great Expectations suites built from the schemas in protege.data.schemas.

Checks GX has no native expectation for (an image decodes, within size limits; an option letter names
one of the listed options; a source line parsed) are computed here into boolean columns, which the suite
then expects to be True like any other column. A failure names the file, the column, the first rows
(with the source line when the table was imported) and the expectation.
"""
from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from PIL import Image, ImageFile

from protege.data.rows import image_path, read_table
from protege.data.schemas import MAX_IMAGE_SIDE, MIN_IMAGE_SIDE, OPTION_LETTERS, QUESTION_ROWS, Schema
from protege.errors import UserFacingError

SHOW_ROWS = 5
TYPE_LISTS = {"str": ["str"], "int": ["int64", "int32", "Int64", "int"], "float": ["float64", "float32", "float"],
              "bool": ["bool", "bool_"]}
# a derived check is reported against the column a user knows
DERIVED_COLUMN = {"image_readable": "image", "image_size_ok": "image", "answer_in_options": "answer",
                  "parsed": "source"}
DERIVED_MEANING = {"image_readable": "image file exists and decodes",
                   "image_size_ok": f"image sides within {MIN_IMAGE_SIDE}..{MAX_IMAGE_SIDE} px",
                   "answer_in_options": "option-letter answer names a listed option",
                   "parsed": "source line parses (UTF-8 JSON with the expected fields)"}


class DatasetInvalid(UserFacingError, ValueError):
    """A dataset failed its suite; the message names file, column, rows and expectation."""


@dataclass
class Failure:
    file: str
    column: str
    expectation: str
    count: int
    rows: list[dict]

    def line(self) -> str:
        shown = ", ".join(f"row {r['row']} (id={r['id']!r}" + (f", {r['source']}" if r.get("source") else "") + ")"
                          for r in self.rows[:SHOW_ROWS])
        more = f" and {self.count - SHOW_ROWS} more" if self.count > SHOW_ROWS else ""
        return f"{self.file}: column '{self.column}' failed {self.expectation} in {self.count} row(s): {shown}{more}"


MAX_IMAGE_PIXELS = MAX_IMAGE_SIDE * MAX_IMAGE_SIDE


_STRICT = threading.Lock()
_lenient_seen = False  # sticky: once a library turned PIL's leniency on, every check takes the lock


def _load_strictly(im) -> None:
    """im.load(), failing on a cut file even where a library has turned on PIL's process-wide leniency
    (lmms-eval sets ImageFile.LOAD_TRUNCATED_IMAGES at import, and PIL then pads a cut image silently). Where
    it is on, checks run one at a time with it off (the flag is global, so threads must not interleave)."""
    global _lenient_seen
    if not (_lenient_seen or ImageFile.LOAD_TRUNCATED_IMAGES):
        im.load()
        return
    with _STRICT:
        _lenient_seen = True
        lenient = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        try:
            im.load()
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = lenient


def image_bytes_checks(data: bytes) -> tuple[bool, bool, str]:
    """(decodes, size within limits, why not) for encoded image bytes. The size comes from the header
    before any pixel is decoded, so an image too large (a decompression bomb included) is reported as
    too large and never decoded."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if max(w, h) > MAX_IMAGE_SIDE or w * h > MAX_IMAGE_PIXELS:
                return True, False, f"too large: {w}x{h} px (at most {MAX_IMAGE_SIDE} px a side)"
            if im.format == "JPEG":
                # libjpeg still reads every coded block at 1/8 scale (a cut file fails alike) but skips
                # most of the inverse DCT: about half the time of a full decode
                im.draft(None, (max(1, w // 8), max(1, h // 8)))
            _load_strictly(im)  # decode the pixels: verify() alone misses truncated files
    except Image.DecompressionBombError:
        return True, False, (f"too large: its header claims more than {2 * Image.MAX_IMAGE_PIXELS} pixels "
                             "(a decompression bomb?)")
    except Exception as exc:  # PIL raises many types for bytes that are not an image
        return False, True, f"does not decode as an image ({type(exc).__name__})"
    if min(w, h) < MIN_IMAGE_SIDE:
        return True, False, f"too small: {w}x{h} px (at least {MIN_IMAGE_SIDE} px a side)"
    return True, True, ""


def image_checks(table: Path, rel) -> tuple[bool, bool]:
    """(decodes, size within limits) for one image path relative to the table.

    An image that does not decode is reported once, by the first check; its size is not judged."""
    if not isinstance(rel, str) or not rel:
        return False, True
    try:
        data = image_path(table, rel).read_bytes()
    except OSError:
        return False, True
    decodes, size_ok, _ = image_bytes_checks(data)
    return decodes, size_ok


def row_image_checks(table: Path, rel, extra) -> tuple[bool, bool]:
    """image_checks over every image of a row: `image`, then the JSON list `extra_images` (optional)."""
    try:
        more = json.loads(extra) if isinstance(extra, str) and extra else []
    except json.JSONDecodeError:
        return False, True
    if not isinstance(more, list):
        return False, True
    results = [image_checks(table, r) for r in [rel, *more]]
    return all(r[0] for r in results), all(r[1] for r in results)


def answer_in_options(answer, options_json) -> bool:
    """A single-letter answer of a multiple-choice row must be one of the first len(options) letters."""
    try:
        options = json.loads(options_json) if isinstance(options_json, str) and options_json else []
    except json.JSONDecodeError:
        return False
    if not options:
        return True
    # exactly one listed letter: "BC" or "" is not an option even though "ABCD" contains it
    return isinstance(answer, str) and answer.strip() in set(OPTION_LETTERS[: len(options)])


def question_frame(path: Path) -> pd.DataFrame:
    """A question table with the derived columns its suite checks."""
    df = read_table(path).reset_index(drop=True)
    df.insert(0, "row", range(len(df)))
    for col in ("question", "answer"):
        df[col] = df[col].map(lambda v: v.strip() if isinstance(v, str) else v)
    extras = df["extra_images"] if "extra_images" in df else [""] * len(df)
    checks = [row_image_checks(path, rel, extra) for rel, extra in zip(df["image"], extras)]
    df["image_readable"] = [c[0] for c in checks]
    df["image_size_ok"] = [c[1] for c in checks]
    df["answer_in_options"] = [answer_in_options(a, o) for a, o in
                               zip(df["answer"], df["options"] if "options" in df else [""] * len(df))]
    if "parsed" not in df:
        df["parsed"] = True
    return df


def _expectations(gx, schema: Schema) -> list:
    e = gx.expectations
    out = []
    for c in schema.columns:
        out.append(e.ExpectColumnToExist(column=c.name))
        if not c.nullable:
            out.append(e.ExpectColumnValuesToNotBeNull(column=c.name))
        out.append(e.ExpectColumnValuesToBeInTypeList(column=c.name, type_list=TYPE_LISTS[c.dtype]))
        if c.unique:
            out.append(e.ExpectColumnValuesToBeUnique(column=c.name))
        if c.min_length is not None or c.max_length is not None:
            out.append(e.ExpectColumnValueLengthsToBeBetween(column=c.name, min_value=c.min_length,
                                                             max_value=c.max_length))
        if c.allowed is not None:
            out.append(e.ExpectColumnValuesToBeInSet(column=c.name, value_set=list(c.allowed)))
        if c.min_value is not None or c.max_value is not None:
            out.append(e.ExpectColumnValuesToBeBetween(column=c.name, min_value=c.min_value, max_value=c.max_value))
    for derived in schema.derived_checks:
        out.append(e.ExpectColumnValuesToBeInSet(column=derived, value_set=[True],
                                                 meta={"meaning": DERIVED_MEANING.get(derived, derived)}))
    return out


def run_suite(frames: dict[str, pd.DataFrame], schema: Schema, id_column: str = "id") -> tuple[dict, list[Failure]]:
    """Validates each frame (keyed by the file name to report) against the schema's suite."""
    import great_expectations as gx  # ~3-7 s to import: only when validating
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # one line per file is enough
    source = ctx.data_sources.add_pandas("protege")
    suite = gx.ExpectationSuite(name=schema.name)
    for exp in _expectations(gx, schema):
        suite.add_expectation(exp)
    suite = ctx.suites.add(suite)
    report, failures = {"suite": schema.name, "files": {}}, []
    for label, df in frames.items():
        df = df.copy()
        for col in df.columns:  # pandas 3 string columns -> object, so GX checks each value's own type
            if isinstance(df[col].dtype, pd.StringDtype):
                df[col] = df[col].astype(object).where(df[col].notna(), None)
        if "row" not in df:
            df.insert(0, "row", range(len(df)))
        if id_column not in df:
            df[id_column] = None
        index_cols = ["row", id_column] + (["source"] if "source" in df else [])
        present = [c.name for c in schema.columns if c.name in df] + [d for d in schema.derived_checks if d in df]
        missing = [c.name for c in schema.columns if c.name not in df and not c.nullable]
        missing += [d for d in schema.derived_checks if d not in df]
        if missing:
            failures.append(Failure(label, ",".join(missing), "expect_column_to_exist", len(df), []))
            report["files"][label] = {"rows": len(df), "success": False, "missing_columns": missing}
            continue
        asset = source.add_dataframe_asset(label)
        batch = asset.add_batch_definition_whole_dataframe("all")
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(data=batch, suite=suite, name=label))
        result = vd.run(batch_parameters={"dataframe": df[list(dict.fromkeys(index_cols + present))]},
                        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": index_cols})
        entries = []
        for r in result.results:
            column = r.expectation_config.kwargs.get("column")
            shown = DERIVED_COLUMN.get(column, column)
            unexpected = r.result.get("unexpected_index_list") or []
            rows = [{"row": int(u["row"]), "id": None if pd.isna(u.get(id_column)) else str(u.get(id_column)),
                     **({"source": u["source"]} if u.get("source") else {})} for u in unexpected[:SHOW_ROWS]]
            name = r.expectation_config.type + (f" ({DERIVED_MEANING[column]})" if column in DERIVED_MEANING else "")
            count = int(r.result.get("unexpected_count") or len(unexpected) or (0 if r.success else 1))
            entries.append({"expectation": name, "column": shown, "success": bool(r.success),
                            "unexpected_count": count if not r.success else 0, "rows": rows})
            if not r.success:
                failures.append(Failure(label, shown, name, count, rows))
        report["files"][label] = {"rows": len(df), "success": bool(result.success), "expectations": entries}
    report["success"] = not failures
    return report, failures


def validate_tables(paths: list[Path], schema: Schema = QUESTION_ROWS) -> tuple[dict, list[Failure]]:
    """Question tables on disk (parquet + images): the derived checks, then the suite."""
    return run_suite({str(p): question_frame(Path(p)) for p in paths}, schema)


def summary_frame(report: dict) -> pd.DataFrame:
    return pd.DataFrame([{"file": f, "expectation": e["expectation"], "column": e["column"],
                          "success": e["success"], "unexpected": e["unexpected_count"]}
                         for f, body in report["files"].items() for e in body.get("expectations", [])])


