"""`protege eval score` on hand-made benchmark files: the score computed by hand, and bad input."""
import base64
import io
import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from protege.cli import app

HEADER = ["index", "image", "question", "hint", "A", "B", "C", "D", "answer", "category", "l2-category", "split"]


def png_b64(colour=(200, 30, 30)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), colour).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def tsv(rows: list[dict]) -> str:
    lines = ["\t".join(HEADER)]
    for r in rows:
        lines.append("\t".join(str(r.get(c, "")) for c in HEADER))
    return "\n".join(lines) + "\n"


def row(index, answer, image=None, **kw):
    return {"index": index, "image": image or png_b64(), "question": "Which shape is shown?", "A": "circle",
            "B": "square", "C": "triangle", "D": "star", "answer": answer, "category": "shapes", "split": "dev", **kw}


def predictions(pairs) -> str:
    return "".join(json.dumps({"index": i, "prediction": p}) + "\n" for i, p in pairs)


def score(tmp_path, benchmark, data_text, preds_text, suffix=".tsv"):
    data = tmp_path / f"bench{suffix}"
    data.write_text(data_text)
    preds = tmp_path / "preds.jsonl"
    preds.write_text(preds_text)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["eval", "score", "--benchmark", benchmark, "--data", str(data),
                                   "--predictions", str(preds), "--out", str(out), "--bootstrap", "200"])
    return res, out


def test_ai2d_score_matches_hand_count(tmp_path):
    data = tsv([row(1, "A"), row(2, "C"), row(3, "D"), row(4, "B"), row(5, "D")])
    # lmms-eval 0.7.3 ai2d: a leading "X." letter or the whole response, equal to the gold ignoring case and
    # punctuation: 1 right, 2 wrong ("The answer is (C)." is not "c"), 3 wrong, 4 wrong, 5 right -> 2 / 5
    preds = predictions([(1, "A"), (2, "The answer is (C)."), (3, "B"), (4, "I cannot tell."), (5, "D")])
    res, out = score(tmp_path, "ai2d", data, preds)
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["score"] == pytest.approx(40.0) and summary["items"] == 5
    assert summary["ci"][0] <= 40.0 <= summary["ci"][1]
    rows = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert [r["extracted"] for r in rows][:3] == ["A", "The answer is (C).", "B"]
    assert "ai2d: 40.00" in res.output
    # the lenient reading also takes "The answer is (C)." -> 3 / 5
    lenient = CliRunner().invoke(app, ["eval", "score", "--benchmark", "ai2d", "--data", str(tmp_path / "bench.tsv"),
                                       "--predictions", str(tmp_path / "preds.jsonl"), "--out", str(tmp_path / "len"),
                                       "--bootstrap", "200", "--protocol", "lenient"])
    assert lenient.exit_code == 0 and "ai2d: 60.00" in lenient.output, lenient.output


def test_mmmu_list_gold_parquet_scores_any_element(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    png = base64.b64decode(png_b64())
    table = pa.table({"id": [f"validation_Math_{i}" for i in (1, 2, 3)], "question": ["How many?"] * 3,
                      "options": ["[]"] * 3, "answer": pa.array([["3", "three"]] * 3, pa.list_(pa.string())),
                      "question_type": ["open"] * 3, "image_1": [{"bytes": png, "path": "1.png"}] * 3})
    pq.write_table(table, tmp_path / "mmmu.parquet")
    (tmp_path / "preds.jsonl").write_text(predictions([("validation_Math_1", "three"),
                                                       ("validation_Math_2", "The answer is 3."),
                                                       ("validation_Math_3", "four")]))
    res = CliRunner().invoke(app, ["eval", "score", "--benchmark", "mmmu", "--data", str(tmp_path / "mmmu.parquet"),
                                   "--predictions", str(tmp_path / "preds.jsonl"), "--out", str(tmp_path / "out"),
                                   "--bootstrap", "200"])
    assert res.exit_code == 0, res.output
    # lmms-eval 0.7.3 eval_open: any element of the list gold -> "three" and 3 right, "four" wrong
    rows = [json.loads(line) for line in (tmp_path / "out" / "items.jsonl").read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0, 1.0, 0.0]


def test_mmbench_circular_copies_count_together(tmp_path):
    rows, preds = [], []
    for q, gold in ((0, "A"), (1, "B")):
        for k in range(4):
            index = q + k * 1_000_000
            letter = "ABCD"[("ABCD".index(gold) + k) % 4]
            rows.append(row(index, letter))
            wrong = q == 1 and k == 2  # one rotated copy of question 1 answered wrongly
            preds.append((index, "A" if wrong and letter != "A" else "B" if wrong else letter))
    res, out = score(tmp_path, "mmbench", tsv(rows), predictions(preds))
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["items"] == 8 and summary["units"] == 2
    assert summary["score"] == pytest.approx(50.0)  # question 0 counts, question 1 does not


def test_missing_predictions_are_named(tmp_path):
    data = tsv([row(i, "A") for i in range(1, 6)])
    res, _ = score(tmp_path, "ai2d", data, predictions([(1, "A"), (2, "A"), (4, "A")]))
    assert res.exit_code == 1
    assert "no prediction for 2 of 5" in res.output and "index 3" in res.output and "index 5" in res.output


def test_undecodable_image_is_named(tmp_path):
    data = tsv([row(1, "A"), row(2, "B", image="bm90IGFuIGltYWdl"), row(3, "C")])
    res, _ = score(tmp_path, "ai2d", data, predictions([(1, "A"), (2, "B"), (3, "C")]))
    assert res.exit_code == 1 and "2" in res.output and "image" in res.output.lower()


def test_answer_letter_beyond_options_is_named(tmp_path):
    data = tsv([row(1, "A"), row(2, "E"), row(3, "C")])
    res, _ = score(tmp_path, "ai2d", data, predictions([(1, "A"), (2, "E"), (3, "C")]))
    assert res.exit_code == 1 and "E" in res.output and "2" in res.output


def test_protocol_comes_from_params_unless_given(tmp_path):
    data = tmp_path / "mmstar.tsv"
    data.write_text(tsv([row(1, "B"), row(2, "C")]))
    preds = tmp_path / "preds.jsonl"
    preds.write_text(predictions([(1, "(b)"), (2, "C")]))  # lmms-eval 0.7.3 reads no letter in "(b)"
    params = tmp_path / "params.yaml"
    params.write_text("evaluate:\n  protocol: lenient\n")

    def run(*extra):
        out = tmp_path / f"out{len(extra)}"
        res = CliRunner().invoke(app, ["eval", "score", "--benchmark", "mmstar", "--data", str(data), "--predictions",
                                       str(preds), "--out", str(out), "--bootstrap", "200", *extra])
        assert res.exit_code == 0, res.output
        return json.loads((out / "summary.json").read_text())

    default, from_params = run(), run("--params", str(params))
    flag_wins = run("--params", str(params), "--protocol", "lmms-eval", "--seed", "1")
    assert default["score"] == pytest.approx(50.0) and default["protocol"].startswith("lmms-eval 0.7.3")
    assert from_params["score"] == pytest.approx(100.0) and from_params["protocol"].startswith("lenient")
    assert flag_wins["score"] == pytest.approx(50.0)
