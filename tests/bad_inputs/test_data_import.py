"""Broken datasets through `protege data import`: a non-zero exit, a message naming the file and line,
and the output folder exactly as it was (no images, no table, no report)."""
import io
import json
import os
import struct
import zlib
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from protege.cli import app


def png(colour=(255, 0, 0), size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def bomb() -> bytes:
    """A valid PNG whose header claims 100000 x 100000 pixels (its data decodes to far less)."""
    data = bytearray(png(size=(1, 1)))
    ihdr = bytearray(data[12:29])             # chunk type + 13 bytes of IHDR data
    ihdr[4:12] = struct.pack(">II", 100_000, 100_000)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)) & 0xFFFFFFFF)
    return bytes(data)


def record(rid, image, question="What colour is it?", answer="Red", **extra) -> dict:
    return {"id": rid, "image": image, "conversations": [{"from": "human", "value": f"<image>\n{question}"},
                                                         {"from": "gpt", "value": answer}], **extra}


@pytest.fixture
def world(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    (images / "red.png").write_bytes(png())
    (tmp_path / "secret.png").write_bytes(png((1, 2, 3)))    # outside --images
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("already computed")
    return tmp_path


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def run_import(world: Path, src: Path, *extra: str):
    before = snapshot(world / "out")
    old = os.getcwd()
    os.chdir(world)
    try:
        res = CliRunner().invoke(app, ["data", "import", "--input", str(src), "--out", str(world / "out"),
                                       "--images", str(world / "images"), *extra])
    finally:
        os.chdir(old)
    return res, before


def jsonl(world: Path, records: list, name="d.jsonl") -> Path:
    path = world / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _cases(world: Path) -> dict:
    (world / "images" / "link.png").symlink_to(world / "secret.png")
    (world / "images" / "a_folder.png").mkdir()
    (world / "images" / "fake.png").write_bytes(b"not an image at all")
    (world / "images" / "bomb.png").write_bytes(bomb())
    (world / "not_parquet.parquet").write_text("id,question\n1,hello\n")
    header_only = {c: pd.Series([], dtype=str) for c in ("id", "question", "answer", "image")}
    pd.DataFrame(header_only).to_parquet(world / "empty.parquet")
    (world / "empty.jsonl").write_text("")
    (world / "empty.json").write_text("[]")
    return {
        "absolute_path": (jsonl(world, [record("1", str(world / "secret.png"))], "absolute_path.jsonl"),
                          "absolute_path.jsonl:1", "absolute image path"),
        "dot_dot": (jsonl(world, [record("1", "../secret.png")], "dot_dot.jsonl"), "dot_dot.jsonl:1", "outside"),
        "symlink_out": (jsonl(world, [record("1", "link.png")], "symlink_out.jsonl"), "symlink_out.jsonl:1", "outside"),
        "folder_as_image": (jsonl(world, [record("1", "a_folder.png")], "folder_as_image.jsonl"),
                            "folder_as_image.jsonl:1", "is a folder, not an image"),
        "bad_image_bytes": (jsonl(world, [record("1", "red.png"), record("2", "fake.png")], "bad_image.jsonl"),
                            "bad_image.jsonl:2", "does not decode"),
        "decompression_bomb": (jsonl(world, [record("1", "bomb.png")], "decompression_bomb.jsonl"),
                               "decompression_bomb.jsonl:1", "too large: its header claims"),
        "conversation_string": (jsonl(world, [{"id": "1", "image": "red.png", "conversations": "hello"}],
                                      "conversation_string.jsonl"), "conversation_string.jsonl:1",
                                "'conversations' is a str"),
        "turn_not_object": (jsonl(world, [{"id": "1", "image": "red.png", "conversations": ["hi", "there"]}],
                                  "turn.jsonl"), "turn.jsonl:1", "conversations[0] is a str"),
        "record_not_object": (jsonl(world, [[1, 2]], "record_not_object.jsonl"),
                              "record_not_object.jsonl:1", "not an object"),
        "two_letters": (jsonl(world, [record("1", "red.png", answer="BC", options=["x", "y", "z", "w"])],
                              "two.jsonl"), "two.jsonl:1", "names a listed option"),
        "letter_beyond": (jsonl(world, [record("1", "red.png", answer="C", options=["x", "y"])],
                                "letter_beyond.jsonl"), "letter_beyond.jsonl:1",
                          "names a listed option"),
        "empty_jsonl": (world / "empty.jsonl", "empty.jsonl", "no rows"),
        "empty_json_list": (world / "empty.json", "empty.json", "no rows"),
        "header_only_parquet": (world / "empty.parquet", "empty.parquet", "no rows"),
        "not_parquet": (world / "not_parquet.parquet", "not_parquet.parquet", "not a readable parquet table"),
        "input_is_folder": (world / "images", "images", "is a folder"),
        "name_too_long": (jsonl(world, [record("1", "x" * 300 + ".png")], "long.jsonl"), "long.jsonl:1",
                          "image file not found"),
    }


CASE_NAMES = ["absolute_path", "dot_dot", "symlink_out", "folder_as_image", "bad_image_bytes", "decompression_bomb",
              "conversation_string", "turn_not_object", "record_not_object", "two_letters", "letter_beyond",
              "empty_jsonl", "empty_json_list", "header_only_parquet", "not_parquet", "input_is_folder",
              "name_too_long"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_rejected_and_nothing_written(world, case):
    src, where, why = _cases(world)[case]
    res, before = run_import(world, src)
    assert res.exit_code == 1, res.output
    assert where in res.output and why in res.output and "Traceback" not in res.output, res.output
    assert snapshot(world / "out") == before
    assert not list(world.glob(".out.import-*"))   # the staging folder is gone too


def test_outside_images_need_the_flag(world):
    src = jsonl(world, [record("1", str(world / "secret.png")), record("2", "../secret.png", question="Q2")])
    res, _ = run_import(world, src, "--allow-outside-images")
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(world / "out" / "train.parquet")
    assert len(table) == 2 and table["image"].nunique() == 1    # one image file for both rows
    assert (world / "out" / table["image"][0]).read_bytes() == (world / "secret.png").read_bytes()
