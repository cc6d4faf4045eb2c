"""Importers: LLaVA conversations and parquet, image hashing, dedup, and every kind of bad row named."""
import base64
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from protege.data.importers import import_dataset
from protege.data.validate import DatasetInvalid


def png(colour=(255, 0, 0), size=32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def record(rid, image, question="What colour is it?", answer="red"):
    return {"id": rid, "image": image,
            "conversations": [{"from": "human", "value": f"<image>\n{question}"}, {"from": "gpt", "value": answer}]}


@pytest.fixture
def image_dir(tmp_path):
    d = tmp_path / "imgs"
    d.mkdir()
    (d / "red.png").write_bytes(png((255, 0, 0)))
    (d / "blue.png").write_bytes(png((0, 0, 255)))
    return d


def write_jsonl(path, records):
    path.write_bytes(b"".join((json.dumps(r) + "\n").encode() if isinstance(r, dict) else r for r in records))
    return path


def test_llava_jsonl_with_paths_base64_multiturn_and_dedup(tmp_path, image_dir):
    """One row per record: the first human turn (the one with the image) and the first reply after it; a
    later turn leans on the conversation before it, which a single-turn row would not show."""
    b64 = base64.b64encode(png((0, 255, 0))).decode()
    recs = [record("a", "red.png"),
            record("b", "red.png"),  # same image + question as "a": a duplicate example
            record("c", f"data:image/png;base64,{b64}", "Which colour?", "green"),
            {"id": "d", "image": "blue.png", "conversations": [
                {"from": "human", "value": "<image>\nColour?"}, {"from": "gpt", "value": "blue"},
                {"from": "human", "value": "Is it dark?"}, {"from": "gpt", "value": "yes"}]}]
    src = write_jsonl(tmp_path / "train.jsonl", recs)
    res = import_dataset(src, "llava", tmp_path / "out", "train", image_root=image_dir)
    df = pd.read_parquet(res.table)
    assert res.rows_read == 4 and res.duplicates_dropped == 1 and res.rows_written == 3
    assert list(df["id"]) == ["a", "c", "d"] and df.loc[2, "answer"] == "blue"
    assert df.loc[0, "question"] == "What colour is it?"  # the <image> placeholder is removed
    assert res.images_written == 3 and df["image"].str.startswith("images/").all()
    for rel, sha in zip(df["image"], df["image_sha256"]):
        assert sha in rel and len(sha) == 64
    assert json.loads(res.report.read_text())["success"]


def test_every_bad_row_is_named(tmp_path, image_dir):
    (image_dir / "fake.png").write_bytes(b"this is not an image")
    recs = [record("ok", "red.png"),
            record("no-image", "missing.png"),
            b'{"id": "latin1", "image": "red.png", "conversations": "caf\xe9"}\n',
            record("empty", "blue.png", answer=""),
            record("dup", "red.png", question="Q1"),
            record("dup", "blue.png", question="Q2"),
            record("fake", "fake.png")]
    src = write_jsonl(tmp_path / "bad.jsonl", recs)
    with pytest.raises(DatasetInvalid) as err:
        import_dataset(src, "llava", tmp_path / "out", "bad", image_root=image_dir)
    msg = str(err.value)
    assert "nothing written" in msg and not (tmp_path / "out").exists()     # not even the images of good rows
    report = re.search(r"report: (\S+)\)", msg).group(1)
    assert json.loads(Path(report).read_text())["success"] is False
    assert "bad.jsonl:2" in msg and "image file not found" in msg            # missing image, by line
    assert "bad.jsonl:3" in msg and "not UTF-8" in msg                       # non-UTF-8 line
    assert "column 'answer'" in msg and "id='empty'" in msg                  # empty answer
    assert "column 'id' failed expect_column_values_to_be_unique" in msg and "id='dup'" in msg
    assert "id='fake'" in msg and "decodes" in msg                           # not an image


def test_parquet_with_bytes_and_options(tmp_path):
    df = pd.DataFrame({"id": ["1", "2"], "question": ["Which?", "Which?"], "answer": ["B", "C"],
                       "image": [{"bytes": png((255, 0, 0))}, {"bytes": png((0, 0, 255))}],
                       "options": [["cat", "dog"], ["cat", "dog"]]})
    src = tmp_path / "mc.parquet"
    df.to_parquet(src)
    with pytest.raises(DatasetInvalid) as err:  # "C" is beyond two options
        import_dataset(src, "parquet", tmp_path / "out", "mc")
    assert "mc.parquet:row 1" in str(err.value) and "names a listed option" in str(err.value)
    df.loc[1, "answer"] = "A"
    df.to_parquet(src)
    res = import_dataset(src, "parquet", tmp_path / "out", "mc")
    assert res.rows_written == 2 and json.loads(pd.read_parquet(res.table)["options"][0]) == ["cat", "dog"]


def test_parquet_target_column_is_kept_and_checked(tmp_path):
    from protege.data.rows import load_rows

    df = pd.DataFrame({"id": ["1", "2"], "question": ["Colour?", "Colour?"], "answer": ["red", "blue"],
                       "image": [{"bytes": png((255, 0, 0))}, {"bytes": png((0, 0, 255))}],
                       "target": ["It is red.", None]})
    src = tmp_path / "t.parquet"
    df.to_parquet(src)
    res = import_dataset(src, "parquet", tmp_path / "out", "t")
    rows = load_rows(res.table)
    assert [r.sft_target for r in rows] == ["It is red.", "blue"] and [r.answer for r in rows] == ["red", "blue"]
    df["target"] = [3, 4]
    df.to_parquet(src)
    with pytest.raises(DatasetInvalid, match=r"t.parquet:row 0: column 'target' holds int 3"):
        import_dataset(src, "parquet", tmp_path / "out2", "t")
    assert not (tmp_path / "out2").exists()


def test_whole_file_errors(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_bytes(b'[{"id": "\xff"}]')
    with pytest.raises(DatasetInvalid, match="not UTF-8 at byte"):
        import_dataset(bad, "llava", tmp_path / "out", "x")
    with pytest.raises(DatasetInvalid, match="file not found"):
        import_dataset(tmp_path / "nope.jsonl", "llava", tmp_path / "out", "x")
    pd.DataFrame({"id": ["1"]}).to_parquet(tmp_path / "p.parquet")
    with pytest.raises(DatasetInvalid, match=r"p.parquet: no question column: expected one of question, problem, "
                                             r"prompt, query or conversations .*the file has id"):
        import_dataset(tmp_path / "p.parquet", "parquet", tmp_path / "out", "p")


def test_cli_import(tmp_path, image_dir):
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "t.jsonl", [record("a", "red.png"), record("b", "missing.png")])
    cmd = [sys.executable, "-m", "protege", "data", "import", "--input", str(src), "--out", str(tmp_path / "o"),
           "--images", str(image_dir)]
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 1 and "t.jsonl:2" in bad.stderr
    write_jsonl(src, [record("a", "red.png")])
    good = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "1 rows read" in good.stdout and (tmp_path / "o" / "train.parquet").exists()
