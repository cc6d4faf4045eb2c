"""Great Expectations suite for question datasets; a failing dataset stops the pipeline.

Image readability is not a native expectation, so each image is opened here and the outcome becomes a
column (`image_readable`) that the suite checks like any other.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from PIL import Image

from protege.data.rows import image_path, read_table

MAX_QUESTION_CHARS = 1000
MAX_ANSWER_CHARS = 200
SHOW_ROWS = 5


class DatasetInvalid(ValueError):
    """A dataset failed its suite; the message names file, column, rows and expectation."""


@dataclass
class Failure:
    file: str
    column: str
    expectation: str
    count: int
    rows: list[dict]

    def line(self) -> str:
        shown = ", ".join(f"row {r['row']} (id={r['id']!r})" for r in self.rows[:SHOW_ROWS])
        more = f" and {self.count - SHOW_ROWS} more" if self.count > SHOW_ROWS else ""
        return f"{self.file}: column '{self.column}' failed {self.expectation} in {self.count} row(s): {shown}{more}"


def _image_readable(table: Path, rel) -> bool:
    if not isinstance(rel, str) or not rel:
        return False
    try:
        with Image.open(image_path(table, rel)) as im:
            im.load()  # decode the pixels: verify() alone misses truncated files
        return True
    except Exception:
        return False


def _suite(gx):
    e = gx.expectations
    suite = gx.ExpectationSuite(name="question_rows")
    for exp in [
        e.ExpectColumnValuesToBeUnique(column="id"),
        e.ExpectColumnValuesToNotBeNull(column="id"),
        e.ExpectColumnValuesToNotBeNull(column="question"),
        e.ExpectColumnValueLengthsToBeBetween(column="question", min_value=1, max_value=MAX_QUESTION_CHARS),
        e.ExpectColumnValuesToNotBeNull(column="answer"),
        e.ExpectColumnValueLengthsToBeBetween(column="answer", min_value=1, max_value=MAX_ANSWER_CHARS),
        e.ExpectColumnValuesToBeInSet(column="image_readable", value_set=[True]),
    ]:
        suite.add_expectation(exp)
    return suite


def validate_tables(paths: list[Path]) -> tuple[dict, list[Failure]]:
    """Runs the suite on each table; returns a JSON-able report and the failures (empty if all pass)."""
    import great_expectations as gx  # ~3-7 s to import: only when validating

    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # one line per file is enough
    source = ctx.data_sources.add_pandas("protege")
    suite = ctx.suites.add(_suite(gx))
    report, failures = {"suite": suite.name, "files": {}}, []
    for path in paths:
        df = read_table(path).reset_index(drop=True)
        df.insert(0, "row", range(len(df)))
        df["image_readable"] = [_image_readable(path, rel) for rel in df["image"]]
        df["question"] = df["question"].map(lambda v: v.strip() if isinstance(v, str) else v)
        df["answer"] = df["answer"].map(lambda v: v.strip() if isinstance(v, str) else v)
        asset = source.add_dataframe_asset(str(path))
        batch = asset.add_batch_definition_whole_dataframe("all")
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(data=batch, suite=suite, name=str(path)))
        result = vd.run(batch_parameters={"dataframe": df},
                        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["row", "id"]})
        entries = []
        for r in result.results:
            column = r.expectation_config.kwargs.get("column")
            # readability is checked on a derived column; report it against the column users know
            shown_column = "image" if column == "image_readable" else column
            unexpected = r.result.get("unexpected_index_list") or []
            entries.append({"expectation": r.expectation_config.type, "column": shown_column,
                            "success": bool(r.success), "unexpected_count": int(r.result.get("unexpected_count") or 0),
                            "rows": [{"row": int(u["row"]), "id": str(u["id"])} for u in unexpected[:SHOW_ROWS]]})
            if not r.success:
                failures.append(Failure(str(path), shown_column, r.expectation_config.type,
                                        int(r.result.get("unexpected_count") or len(unexpected)),
                                        entries[-1]["rows"]))
        report["files"][str(path)] = {"rows": len(df), "success": bool(result.success), "expectations": entries}
    report["success"] = not failures
    return report, failures


def summary_frame(report: dict) -> pd.DataFrame:
    return pd.DataFrame([{"file": f, "expectation": e["expectation"], "column": e["column"],
                          "success": e["success"], "unexpected": e["unexpected_count"]}
                         for f, body in report["files"].items() for e in body["expectations"]])
