"""Rows hold image paths: loading a table decodes nothing, `row.image` decodes the same pixels every time (and
keeps none), scans that need sizes or counts read headers, and batches decoded by worker processes are the
very batches decoded in-process, in order."""
import json
import random

import pandas as pd
import pytest
import torch
from PIL import Image, ImageFile

from protege.data.loader import consecutive, decoded_batches, row_sources, workers_of_rank
from protege.data.rows import ImageFiles, Row, image_path, image_paths, load_rows, read_table, stand_ins
from protege.errors import UserFacingError


@pytest.fixture
def decodes(monkeypatch) -> list:
    """Every pixel decode (ImageFile.load) from here on, by the file it read."""
    seen = []
    real = ImageFile.ImageFile.load

    def load(self):
        seen.append(getattr(self, "filename", None))
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


def direct(table, rec) -> list[Image.Image]:
    out = []
    for rel in image_paths(rec):
        with Image.open(image_path(table, rel)) as im:
            out.append(im.convert("RGB"))
    return out


def test_loading_a_table_decodes_no_image(tiny_world, decodes, monkeypatch):
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    rows = load_rows(tiny_world / "train.parquet")
    assert rows and not decodes and not opened  # not even a header
    assert all(isinstance(r.source, ImageFiles) for r in rows)
    rows[0].image
    assert decodes


def test_row_image_is_the_pixels_of_its_files_decoded_anew(tiny_world):
    table = tiny_world / "train.parquet"
    rows = load_rows(table)
    several = 0
    for row, rec in zip(rows, read_table(table).to_dict("records")):
        want = direct(table, rec)
        got = row.image
        got = got if isinstance(got, list) else [got]
        assert isinstance(row.image, list) == (len(want) > 1)
        several += len(want) > 1
        assert [(g.mode, g.size, g.tobytes()) for g in got] == [(w.mode, w.size, w.tobytes()) for w in want]
        assert row.image_count == len(want) and row.image_sizes() == [w.size for w in want]
    assert several  # the world has questions about two images
    one = rows[0]
    assert one.image is not one.image  # decoded on each access ...
    assert not hasattr(one, "__dict__")  # ... and the row has nowhere to keep pixels


def test_rows_built_in_code_keep_their_images():
    a, b = Image.new("RGB", (32, 20), (1, 2, 3)), Image.new("RGB", (8, 8))
    one = Row("x", "count", "How many?", "3", [], a)
    two = Row("y", "", "Which?", "B", ["A", "B"], [a, b], target="B.")
    assert one.image is a and two.image == [a, b] and two.sft_target == "B." and one.sft_target == "3"
    assert (one.image_count, two.image_count, Row("z", "", "q", "a", [], None).image_count) == (1, 2, 0)
    assert two.image_sizes() == [(32, 20), (8, 8)]
    blanks = stand_ins(two.source)
    assert [im.size for im in blanks] == [(32, 20), (8, 8)] and stand_ins(one.source).size == (32, 20)


def test_sizes_and_counts_come_from_headers(tiny_world, tiny_processor, decodes):
    from protege.generation.vllm_backend import image_limit

    rows = load_rows(tiny_world / "train.parquet")
    tiny_processor.check_images(rows, "train.parquet")
    sizes = [r.image_sizes() for r in rows]
    blanks = [stand_ins(r.source) for r in rows[:4]]
    assert not decodes
    assert sizes == [[im.size for im in (r.image if isinstance(r.image, list) else [r.image])] for r in rows]
    assert [b.size if not isinstance(b, list) else [x.size for x in b] for b in blanks] == \
        [s[0] if len(s) == 1 else s for s in sizes[:4]]

    class Vision:
        vision_config = object()
    assert image_limit(Vision(), [r.image_count for r in rows]) == 2 == image_limit(Vision(), [r.image for r in rows])


def test_prompt_lengths_measured_on_stand_ins_match_the_images(tiny_world, tiny_processor):
    from protege.data.curate import with_token_lengths
    from protege.eval.runner import prompt_extent

    table = tiny_world / "rl.parquet"
    rows = load_rows(table)
    questions = [r.question for r in rows]
    assert prompt_extent(tiny_processor, [], questions, [r.source for r in rows], batch_size=5) == \
        prompt_extent(tiny_processor, [], questions, [r.image for r in rows], batch_size=5)
    df = with_token_lengths(table, tiny_processor)
    first = [r.image[0] if isinstance(r.image, list) else r.image for r in rows]  # curate counts the first image
    assert list(df["tokens"]) == [tiny_processor.token_length(r.question, r.answer, im) for r, im in zip(rows, first)]


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_decoded_by_workers_are_the_in_process_ones_in_order(tiny_world, workers):
    rows = load_rows(tiny_world / "train.parquet")
    rng = random.Random(3)
    plan = [rng.sample(range(len(rows)), rng.randint(1, 7)) for _ in range(9)]
    torch_rng = torch.random.get_rng_state()
    got = list(decoded_batches(row_sources(rows), iter(plan), workers))
    assert torch.equal(torch.random.get_rng_state(), torch_rng)  # the stream sampling and training read
    assert [idx for idx, _ in got] == plan
    for idx, images in got:
        for i, im in zip(idx, images):
            want = rows[i].image
            pairs = zip(im, want) if isinstance(want, list) else [(im, want)]
            assert all(a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes() for a, b in pairs)


def test_consecutive_batches_cover_the_table_once():
    assert list(consecutive(7, 3)) == [[0, 1, 2], [3, 4, 5], [6]] and list(consecutive(0, 3)) == []


@pytest.fixture
def corrupt_table(tmp_path, tiny_world):
    """A copy of three world rows whose second row's image is not an image."""
    df = read_table(tiny_world / "test.parquet").head(3).copy()
    (tmp_path / "images").mkdir()
    for i, rec in enumerate(df.to_dict("records")):
        for rel in image_paths(rec):
            target = tmp_path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"not a png at all" if i == 1 else image_path(tiny_world / "test.parquet", rel).read_bytes())
    df.to_parquet(tmp_path / "test.parquet", index=False)
    return tmp_path / "test.parquet", df.iloc[1]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_that_does_not_decode_names_the_table_the_row_and_the_file(corrupt_table, workers):
    table, bad = corrupt_table
    rows = load_rows(table)  # paths only: the table loads
    path = image_path(table, bad["image"])
    expected = rf"^{table}: row 1 \(id {bad['id']!r}\): image {path} cannot be read \(UnidentifiedImageError"
    with pytest.raises(UserFacingError, match=expected):
        rows[1].image
    with pytest.raises(UserFacingError, match=expected):
        list(decoded_batches(row_sources(rows), [[0], [2, 1]], workers))
    with pytest.raises(UserFacingError, match=expected):
        rows[1].image_sizes()


def test_a_missing_image_is_named_when_used(corrupt_table):
    table, bad = corrupt_table
    image_path(table, bad["image"]).unlink()
    with pytest.raises(UserFacingError, match=rf"row 1 \(id {bad['id']!r}\): image .* cannot be read \(No such file"):
        load_rows(table)[1].image


def test_several_images_of_a_row_travel_together(tmp_path):
    for k, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        Image.new("RGB", (16 + k, 16), colour).save(tmp_path / f"{k}.png")
    pd.DataFrame([{"id": "a", "question": "q", "answer": "a", "image": "0.png",
                   "extra_images": json.dumps(["1.png", "2.png"])},
                  {"id": "b", "question": "q", "answer": "a", "image": "2.png", "extra_images": "[]"}]
                 ).to_parquet(tmp_path / "t.parquet", index=False)
    rows = load_rows(tmp_path / "t.parquet")
    [(_, (three, one))] = list(decoded_batches(row_sources(rows), [[0, 1]], 1))
    assert [im.size for im in three] == [(16, 16), (17, 16), (18, 16)] and one.size == (18, 16)
    assert three[2].getpixel((0, 0)) == (0, 0, 255) and rows[0].image_count == 3 and rows[1].image_count == 1


@pytest.mark.parametrize("local, workers, shares", [(1, 2, [2]), (3, 4, [2, 1, 1]), (4, 2, [1, 1, 0, 0]),
                                                    (2, 0, [0, 0])])
def test_workers_are_a_machine_total_split_between_its_ranks(monkeypatch, local, workers, shares):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    got = []
    for rank in range(local):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        got.append(workers_of_rank(workers))
    assert got == shares


def test_an_unlaunched_process_takes_every_worker(monkeypatch):
    for var in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    assert workers_of_rank(2) == 2
