"""Importing at size: files read as they go, images checked batch by batch into a cache that a failed run
keeps for the next, images kept in place, and rejections that name a few rows and count the rest."""
import hashlib
import io
import json
import random
import re
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from protege.data import importers
from protege.data.importers import cache_folder, import_dataset
from protege.data.layouts import _json_array, raw_records
from protege.data.validate import DatasetInvalid, image_bytes_checks


def png(colour=(255, 0, 0), size=32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def jpeg(seed: int, progressive=False) -> bytes:
    rng = random.Random(seed)
    im = Image.new("RGB", (64, 48))
    im.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(64 * 48)])
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90, progressive=progressive)
    return buf.getvalue()


def record(rid, image, question="What colour is it?", answer="red", **extra):
    return {"id": rid, "image": image, **extra,
            "conversations": [{"from": "human", "value": f"<image>\n{question}"}, {"from": "gpt", "value": answer}]}


def write_jsonl(path: Path, records) -> Path:
    path.write_bytes(b"".join((json.dumps(r) + "\n").encode() if isinstance(r, dict) else r for r in records))
    return path


@pytest.fixture
def images(tmp_path) -> Path:
    d = tmp_path / "imgs"
    d.mkdir()
    for i in range(12):
        (d / f"{i}.png").write_bytes(png((i * 20, 0, 255 - i * 20)))
    (d / "fake.png").write_bytes(b"not an image")
    (d / "cut.jpg").write_bytes(jpeg(1)[:400])
    return d


# --- JSON read incrementally ----------------------------------------------------------------------------------

def _whole(path: Path):
    """What reading the whole file with json.loads gives: the records, or the error's text."""
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"{path}: not UTF-8 at byte {exc.start}; expected a UTF-8 JSON list of records"
    except json.JSONDecodeError as exc:
        return f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}"
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    return data if isinstance(data, list) else f"{path}: expected a JSON list of records, got {type(data).__name__}"


def _streamed(path: Path, chunk: int):
    out = []
    try:
        out.extend(_json_array(path, chunk))
    except DatasetInvalid as exc:
        return str(exc)
    return out


def _value(rng: random.Random, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice([1, -2.5e3, 12345678901234, 'str\n"é😀\\', True, None, 0.1, "x" * rng.randint(0, 200)])
    if r < 0.6:
        return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 4))}
    return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


def test_a_json_file_read_in_chunks_gives_what_json_loads_gives(tmp_path):
    """Records, `{"data": [...]}`, and for broken files (cut, a byte inserted or dropped, a BOM, trailing
    text, bad UTF-8) the same message with the same line, whatever the chunk size."""
    rng = random.Random(7)
    path = tmp_path / "f.json"
    for _ in range(400):
        recs = [_value(rng) for _ in range(rng.randint(0, 6))]
        doc = rng.choice([recs, {"meta": _value(rng), "data": recs, "z": 1}, {"data": recs}, {"x": 1}, 5])
        data = json.dumps(doc, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode()
        op, at = rng.random(), rng.randrange(len(data) + 1)
        if op < 0.2:
            data = data[:at]
        elif op < 0.4:
            data = data[:at] + bytes([rng.choice(b',]}[{" :\\\nx\xff\xc3')]) + data[at:]
        elif op < 0.5:
            data = data[:at] + data[at + 1:]
        elif op < 0.55:
            data = b"\xef\xbb\xbf" + data
        elif op < 0.6:
            data += rng.choice([b" x", b"\n ]", b"  \n", b",", b"\xff"])
        path.write_bytes(data)
        expected = _whole(path)
        for chunk in (1, 5, 64, 1 << 20):
            assert _streamed(path, chunk) == expected, (data, chunk)


def test_a_json_list_yields_its_first_records_before_the_file_ends(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b'[{"id": "a"},\n {"id": "b"},\n' + b" " * 3_000_000 + b"\n {oops}]")
    got = []
    with pytest.raises(DatasetInvalid, match=r"big.json: not valid JSON at line 4: Expecting property name"):
        for label, rec, _ in raw_records(path):
            got.append((label, rec))
    assert got == [("big.json:record 0", {"id": "a"}), ("big.json:record 1", {"id": "b"})]


def test_jsonl_lines_are_numbered_as_before(tmp_path):
    """Read line by line, with CRLF, lone CR and blank lines numbered as splitting the whole file did."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\n{"a": 2}\r{"a": 3}\n[1]\n{bad\n\xff\n  \n{"a": 4}')
    got = [(label, rec, why) for label, rec, why in raw_records(path)]
    assert got == [("t.jsonl:1", {"a": 1}, ""), ("t.jsonl:3", {"a": 2}, ""), ("t.jsonl:4", {"a": 3}, ""),
                   ("t.jsonl:5", None, "not an object"),
                   ("t.jsonl:6", None, "not JSON (Expecting property name enclosed in double quotes)"),
                   ("t.jsonl:7", None, "not UTF-8 (byte 0)"), ("t.jsonl:9", {"a": 4}, "")]


# --- batches ---------------------------------------------------------------------------------------------------

def _bad_corpus(tmp_path: Path) -> Path:
    """Rows of every kind of fault, the duplicates across batch boundaries."""
    return write_jsonl(tmp_path / "bad.jsonl", [
        record("ok0", "0.png"),
        record("dup-of-ok0", "0.png"),                           # same image and question: dropped
        record("missing", "nope.png"),
        b'{"id": "latin1", "image": "1.png", "conversations": "caf\xe9"}\n',
        record("empty", "2.png", answer=""),
        record("same-id", "3.png", question="Q1"),
        record("same-id", "4.png", question="Q2"),
        record("fake", "fake.png"),
        record("cut", "cut.jpg"),
        record("letter", "5.png", answer="C", options=["x", "y"]),
        {"id": "turns", "image": "6.png", "conversations": ["hi", "there"]},
        record("ok7", "7.png"),
        record("dup-of-ok7", "7.png"),
        b"[1, 2]\n",
    ])


def test_batch_sizes_give_the_same_failures_and_report(tmp_path, images):
    src = _bad_corpus(tmp_path)
    seen = {}
    for batch in (2, 1024):
        with pytest.raises(DatasetInvalid) as err:
            import_dataset(src, "llava", tmp_path / f"out{batch}", "bad", image_root=images, batch_rows=batch,
                           cache=cache_folder(tmp_path / f"out{batch}"))
        msg = str(err.value)
        report = json.loads(Path(re.search(r"report: (\S+)\)", msg).group(1)).read_text())
        body = re.sub(r"report: \S+\)", "report: R)", msg.replace(str(tmp_path / f"out{batch}"), "OUT"))
        body = body.replace(str(cache_folder(tmp_path / f"out{batch}")), "CACHE")
        seen[batch] = (body, report)
        assert not (tmp_path / f"out{batch}").exists()
    assert seen[2] == seen[1024]
    msg, report = seen[2]
    for where in ("bad.jsonl:3", "bad.jsonl:4", "bad.jsonl:11", "bad.jsonl:14"):
        assert where in msg
    assert "id='empty'" in msg and "id='same-id'" in msg and "id='fake'" in msg and "id='cut'" in msg
    assert "id='letter'" in msg and "kept in CACHE for the next run" in msg
    assert report["rows_read"] == 14 and report["duplicates_dropped"] == 2 and not report["success"]


def test_batch_sizes_give_the_same_table(tmp_path, images):
    src = write_jsonl(tmp_path / "good.jsonl", [record(f"q{i}", f"{i % 7}.png", question=f"Q{i % 9}")
                                                 for i in range(40)])
    tables = {}
    for batch in (3, 1024):
        res = import_dataset(src, "llava", tmp_path / f"out{batch}", "t", image_root=images, batch_rows=batch,
                             cache=cache_folder(tmp_path / f"out{batch}"))
        tables[batch] = pd.read_parquet(res.table)
        assert (res.rows_read, res.images_written) == (40, 7)
        assert not cache_folder(tmp_path / f"out{batch}").exists()     # gone once the import is written
    pd.testing.assert_frame_equal(tables[3], tables[1024])
    assert len(tables[3]) == len({(i % 7, i % 9) for i in range(40)})     # duplicates across batches


# --- the cache a failed run keeps ------------------------------------------------------------------------------

def test_a_failed_run_keeps_its_checked_images_for_the_next(tmp_path, images, monkeypatch):
    writes, checks = [], []
    real_write, real_checks = importers.ImageStore._write, importers.image_bytes_checks
    monkeypatch.setattr(importers.ImageStore, "_write", lambda self, rel, data: (writes.append(rel),
                                                                                 real_write(self, rel, data)))
    monkeypatch.setattr(importers, "image_bytes_checks", lambda data: (checks.append(1), real_checks(data))[1])
    recs = [record(f"q{i}", f"{i}.png") for i in range(10)] + [record("bad", "fake.png")]
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    out, cache = tmp_path / "out", cache_folder(tmp_path / "out")
    with pytest.raises(DatasetInvalid) as err:
        import_dataset(src, "llava", out, "d", image_root=images, batch_rows=4, cache=cache)
    assert f"kept in {cache} for the next run" in str(err.value) and "d.jsonl:11" in str(err.value)
    assert not out.exists() and len(list((cache / "images").iterdir())) == 10
    assert (len(writes), len(checks)) == (10, 11)

    writes.clear(), checks.clear()
    (images / "10.png").write_bytes(png((1, 2, 3)))
    write_jsonl(src, recs[:10] + [record("fixed", "10.png")])
    res = import_dataset(src, "llava", out, "d", image_root=images, batch_rows=4, cache=cache)
    assert (len(writes), len(checks)) == (1, 1)                     # only the new image is read and stored
    assert res.rows_written == 11 and res.images_written == 11 and not cache.exists()
    table = pd.read_parquet(res.table)
    assert all((out / rel).read_bytes() == (images / f"{i}.png").read_bytes()
               for i, rel in enumerate(table["image"]))


def test_a_changed_image_file_is_read_again(tmp_path, images):
    src = write_jsonl(tmp_path / "d.jsonl", [record("a", "0.png"), record("b", "fake.png")])
    cache = cache_folder(tmp_path / "out")
    with pytest.raises(DatasetInvalid):
        import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, cache=cache)
    (images / "fake.png").write_bytes(png((9, 9, 9)))                  # fixed in place: new size and time
    res = import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, cache=cache)
    assert res.rows_written == 2


def test_a_cut_cache_file_is_not_trusted(tmp_path, images):
    """An image file the cache holds without its index line (a run killed while writing it) is written again."""
    src = write_jsonl(tmp_path / "d.jsonl", [record("a", "0.png")])
    cache = cache_folder(tmp_path / "out")
    digest = hashlib.sha256((images / "0.png").read_bytes()).hexdigest()
    (cache / "images").mkdir(parents=True)
    (cache / "images" / f"{digest}.png").write_bytes(b"\x89PNG cut short")
    res = import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, cache=cache)
    assert (tmp_path / "out" / pd.read_parquet(res.table)["image"][0]).read_bytes() == (images / "0.png").read_bytes()


def test_without_a_cache_a_rejection_leaves_nothing_beside_out(tmp_path, images):
    """The retraining pool imports into a folder DVC versions whole: a kept cache there would be versioned."""
    src = write_jsonl(tmp_path / "d.jsonl", [record("a", "0.png"), record("b", "fake.png")])
    with pytest.raises(DatasetInvalid) as err:
        import_dataset(src, "llava", tmp_path / "out", "d", image_root=images)
    assert "kept in" not in str(err.value) and sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "imgs"]


# --- rejections at size ----------------------------------------------------------------------------------------

def test_a_rejection_names_ten_rows_and_counts_the_rest(tmp_path, images):
    recs = [record(f"q{i}", f"gone{i}.png") for i in range(25)] + [record("ok", "0.png")]
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    with pytest.raises(DatasetInvalid) as err:
        import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, batch_rows=8)
    msg = str(err.value)
    details = msg.split("details:\n", 1)[1].splitlines()
    assert [d.split(":")[1] for d in details[:10]] == [str(i) for i in range(1, 11)]
    assert details[10] == "  and 15 more row(s) with a reason (all in the report)"
    assert "d.jsonl:12" not in msg.split("details:")[1]
    assert "in 25 row(s)" in msg and " and 20 more" in msg                  # the suite's own cap (5 rows)
    report = json.loads(Path(re.search(r"report: (\S+)\)", msg).group(1)).read_text())
    assert len(report["row_notes"]) == 25 and report["row_notes"][24]["source"] == "d.jsonl:25"


def test_a_cut_jpeg_deep_in_a_file_is_named(tmp_path, images):
    recs = [record(f"q{i}", f"{i % 10}.png", question=f"Q{i}") for i in range(300)]
    recs[271] = record("cut", "cut.jpg")
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    with pytest.raises(DatasetInvalid, match=r"row 271 \(id='cut', d.jsonl:272\)") as err:
        import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, batch_rows=16)
    assert "d.jsonl:272: does not decode as an image" in str(err.value)


@pytest.mark.parametrize("lenient", [False, True])
@pytest.mark.parametrize("progressive", [False, True])
def test_a_jpeg_is_checked_whole(progressive, lenient, monkeypatch):
    """The check decodes JPEGs at 1/8 scale: every coded block is still read, so a cut file still fails, also
    where a library has turned on PIL's process-wide leniency for cut files (lmms-eval does at import)."""
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", lenient)
    data = jpeg(3, progressive)
    assert image_bytes_checks(data) == (True, True, "")
    for cut in (len(data) // 3, len(data) - 4):
        assert image_bytes_checks(data[:cut])[:2] == (False, True)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is lenient  # left as the library set it


def test_progress_lines(tmp_path, images):
    src = write_jsonl(tmp_path / "d.jsonl", [record(f"q{i}", f"{i}.png") for i in range(10)])
    lines = []
    import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, batch_rows=4, say=lines.append)
    assert lines[0].startswith("4 rows (") and lines[-1].startswith("10/10 rows (") and "in all" in lines[-1]


# --- images in place -------------------------------------------------------------------------------------------

def test_images_in_place_are_checked_hashed_and_not_copied(tmp_path, images):
    from protege.data.rows import load_rows

    recs = [record("a", "0.png"), record("b", "1.png"), record("c", "0.png", question="Again?"),
            record("d", f"data:image/png;base64,{__import__('base64').b64encode(png((7, 7, 7))).decode()}")]
    src = write_jsonl(tmp_path / "d.jsonl", recs)
    res = import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, images_in_place=True)
    table = pd.read_parquet(res.table)
    assert list(table["image"][:3]) == [str((images / n).resolve()) for n in ("0.png", "1.png", "0.png")]
    assert table["image_sha256"][1] == hashlib.sha256((images / "1.png").read_bytes()).hexdigest()
    assert table["image"][3].startswith("images/")             # given inside the data: no file to point at
    assert res.images_written == 1 and len(list((tmp_path / "out" / "images").iterdir())) == 1
    rows = load_rows(res.table)
    assert [r.id for r in rows] == ["a", "b", "c", "d"] and rows[1].image.getpixel((0, 0)) == (20, 0, 235)


def test_images_in_place_still_refuse_a_bad_image(tmp_path, images):
    src = write_jsonl(tmp_path / "d.jsonl", [record("a", "0.png"), record("b", "fake.png")])
    with pytest.raises(DatasetInvalid, match="d.jsonl:2: does not decode"):
        import_dataset(src, "llava", tmp_path / "out", "d", image_root=images, images_in_place=True)
    assert not (tmp_path / "out").exists()


def test_the_cli_flag_and_the_data_stage_setting(tmp_path, images):
    from typer.testing import CliRunner

    from protege.cli import app
    from protege.config import Config
    from protege.stages import data

    src = write_jsonl(tmp_path / "t.jsonl", [record("a", "0.png"), record("b", "fake.png")])
    cli = ["data", "import", "--input", str(src), "--out", str(tmp_path / "o"), "--images", str(images),
           "--images-in-place"]
    res = CliRunner().invoke(app, cli)
    assert res.exit_code == 1 and f"kept in {tmp_path / '.o-import-cache'} for the next run" in res.output
    write_jsonl(src, [record("a", "0.png"), record("b", "1.png")])
    res = CliRunner().invoke(app, cli)
    assert res.exit_code == 0, res.output
    assert not (tmp_path / ".o-import-cache").exists()
    assert pd.read_parquet(tmp_path / "o" / "train.parquet")["image"][0] == str((images / "0.png").resolve())
    assert "t.jsonl: 2/2 rows (" in res.output                # progress lines (on stderr)

    write_jsonl(tmp_path / "rl.jsonl", [record("r", "2.png")])
    write_jsonl(tmp_path / "test.jsonl", [record("e", "3.png")])

    class NoRun:
        def log_params(self, *a, **k): pass
        def log_input(self, *a, **k): pass
        def log_metrics(self, *a, **k): pass

    cfg = Config(data={"source": "files", "train": "t.jsonl", "rl": "rl.jsonl", "test": "test.jsonl",
                       "images": str(images), "images_in_place": True}, model={"path": str(tmp_path / "m")})
    data.run(cfg, tmp_path, NoRun())
    rl = pd.read_parquet(tmp_path / "data/imported/rl.parquet")
    assert rl["image"][0] == str((images / "2.png").resolve())
    assert not list((tmp_path / "data/imported/images").iterdir())
