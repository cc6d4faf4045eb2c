"""Broken benchmark and prediction files through `protege eval score`: exit 1, the file, row and column
named, and no output folder written."""
import base64
import io
import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from protege.cli import app

HEADER = ["index", "image", "question", "hint", "A", "B", "C", "D", "answer", "category", "l2-category", "split"]


def png_b64() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 20, 30)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


IMG = png_b64()


def tsv(rows: list[dict], header=HEADER) -> bytes:
    lines = ["\t".join(header)] + ["\t".join(str(r.get(c, "")) for c in header) for r in rows]
    return ("\n".join(lines) + "\n").encode()


def mc(index="1", answer="A", image=IMG, **kw) -> dict:
    return {"index": index, "image": image, "question": "Which?", "A": "a", "B": "b", "C": "c", "D": "d",
            "answer": answer, "category": "x", "split": "dev", **kw}


OPEN_HEADER = ["index", "image", "question", "answer"]
GOOD_PREDS = b'{"index": 1, "prediction": "A"}\n'

CASES = {
    "header_only": ("ai2d", tsv([]), GOOD_PREDS, "bench.tsv", "has no rows"),
    "empty_gold_mc": ("ai2d", tsv([mc(answer="")]), GOOD_PREDS, "bench.tsv", "row 1 (index 1): answer ''"),
    "gold_two_letters": ("ai2d", tsv([mc(answer="AB")]), GOOD_PREDS, "bench.tsv", "column 'answer'"),
    "empty_gold_open": ("chartqa", tsv([{"index": 1, "image": IMG, "question": "How many?", "answer": ""}],
                                       OPEN_HEADER), b'{"index": 1, "prediction": ""}\n', "bench.tsv",
                        "expected a non-empty gold answer: row 1"),
    "empty_index": ("ai2d", tsv([mc(index="")]), GOOD_PREDS, "bench.tsv", "expected a non-empty index: row 1"),
    "duplicate_index": ("ai2d", tsv([mc(), mc()]), GOOD_PREDS, "bench.tsv", "row 1 (index 1): also on row(s) 2"),
    "pointer_to_missing_row": ("ai2d", tsv([mc(image="7")]), GOOD_PREDS, "bench.tsv",
                               "row 1 (index 1): its image refers to index 7, which is not in the file"),
    # "1234" is also valid base64 (of 3 bytes that are no image): still read as the index it is
    "pointer_that_is_base64": ("ai2d", tsv([mc(), mc(index="2", image="1234")]), GOOD_PREDS, "bench.tsv",
                               "row 2 (index 2): its image refers to index 1234, which is not in the file"),
    "pointer_chain_to_missing_row": ("ai2d", tsv([mc(image="2"), mc(index="2", image="99")]), GOOD_PREDS,
                                     "bench.tsv", "row 1 (index 1): its image refers to index 2, whose image "
                                                  "refers to index 99, which is not in the file"),
    "pointer_cycle": ("ai2d", tsv([mc(image="2"), mc(index="2", image="1")]), GOOD_PREDS, "bench.tsv",
                      "the pointers from there run in a circle"),
    "image_not_decodable": ("ai2d", tsv([mc(image=base64.b64encode(b"x" * 80).decode())]), GOOD_PREDS,
                            "bench.tsv", "column 'image'"),
    "missing_column": ("ai2d", b"index\tquestion\tanswer\n1\tQ\tA\n", GOOD_PREDS, "bench.tsv", "image"),
    "not_utf8_predictions": ("ai2d", tsv([mc()]), b'{"index": 1, "prediction": "A\xff"}\n', "preds.jsonl",
                             "line 1: not UTF-8 (byte 0xff"),
    "prediction_not_object": ("ai2d", tsv([mc()]), b'["A"]\n', "preds.jsonl", "line 1: expected"),
    "prediction_not_json": ("ai2d", tsv([mc()]), b"A\n", "preds.jsonl", "line 1: not JSON"),
    "prediction_twice": ("ai2d", tsv([mc()]), GOOD_PREDS * 2, "preds.jsonl", "line 2: index 1 predicted twice"),
    "missing_prediction": ("ai2d", tsv([mc(), mc(index="2")]), GOOD_PREDS, "preds.jsonl", "no prediction for 1 of 2"),
    "unknown_prediction": ("ai2d", tsv([mc()]), GOOD_PREDS + b'{"index": 9, "prediction": "A"}\n', "preds.jsonl",
                           "not in the benchmark file: 9"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_eval_score_rejects(tmp_path, case):
    benchmark, data, preds, where, why = CASES[case]
    (tmp_path / "bench.tsv").write_bytes(data)
    (tmp_path / "preds.jsonl").write_bytes(preds)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["eval", "score", "--benchmark", benchmark, "--data", str(tmp_path / "bench.tsv"),
                                   "--predictions", str(tmp_path / "preds.jsonl"), "--out", str(out),
                                   "--bootstrap", "100"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error: ") and where in res.output and why in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()
