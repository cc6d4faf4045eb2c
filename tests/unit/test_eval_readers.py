"""Benchmark readers and writers: every benchmark round-trips through its TSV and its parquet (or JSON)
layout, hand-written VLMEvalKit rows read as VLMEvalKit means them, and each kind of bad file is named."""
import base64
import io
import json

import pyarrow.parquet as pq
import pytest
from PIL import Image

from protege.errors import UserFacingError
from protege.bench.items import BENCHMARKS, BenchItem
from protege.eval.readers import (
    line_options,
    mmstar_options,
    read_benchmark,
    split_markers,
)
from protege.eval.writers import write_benchmark


def png(colour=(255, 0, 0), size=8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def jpg(colour=(0, 128, 0), size=16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="JPEG")
    return buf.getvalue()


RED, GREEN, BLUE = png((255, 0, 0)), png((0, 255, 0)), jpg((0, 0, 255))
ABCD = {"A": "a cat", "B": "a dog, sitting", "C": "None", "D": "NA"}


def mc(name, index, answer="B", options=ABCD, images=(RED,), **kw):
    return BenchItem(benchmark=name, index=index, question=f"Question {index}: what is shown?", images=list(images),
                     answer=answer, options=dict(options), **kw)


def open_item(name, index, answer, images=(RED,), **kw):
    return BenchItem(benchmark=name, index=index, question=f"Question {index}: how many?", images=list(images),
                     answer=answer, **kw)


def items_for(name):
    if name == "ai2d":
        return [mc(name, "0"), mc(name, "1", answer="D", images=(BLUE,))]
    if name == "chartqa":
        return [open_item(name, "0", "62", category="human_test"),
                open_item(name, "1", "None", category="augmented_test", images=(BLUE,))]
    if name == "mathvista":
        mcq = BenchItem(name, "1", "Which is larger?", [RED], answer="3/5", options={"A": "1/2", "B": "3/5"},
                        category="figure question answering", l2_category="math-targeted-vqa",
                        meta={"question_type": "multi_choice", "answer_type": "text", "precision": None,
                              "unit": "", "choices": ["1/2", "3/5"], "skills": ["arithmetic reasoning"]})
        fi = BenchItem(name, "2", "How many bars?", [BLUE], answer="7", category="math word problem",
                       l2_category="general-vqa",
                       meta={"question_type": "free_form", "answer_type": "integer", "precision": None, "unit": "",
                             "choices": []})
        fl = BenchItem(name, "3", "How long is it?", [GREEN], answer="1.5", category="geometry problem solving",
                       l2_category="math-targeted-vqa",
                       meta={"question_type": "free_form", "answer_type": "float", "precision": 1, "unit": "cm",
                             "choices": []})
        return [mcq, fi, fl]
    if name in ("mmbench", "mmbench_cn"):
        rot = {"A": "a dog, sitting", "B": "None", "C": "NA", "D": "a cat"}
        # tabs, line breaks and quotes in a cell must survive VLMEvalKit's TSV quoting
        return [mc(name, "5", category="attribute_recognition", l2_category="FP-S", hint='look\tclosely\n"now"'),
                mc(name, "1000005", answer="A", options=rot, category="attribute_recognition", l2_category="FP-S",
                   hint='look\tclosely\n"now"'),
                mc(name, "7", answer="C", options={"A": "x", "B": "y", "C": "z"}, category="ocr",
                   l2_category="FP-C", images=(BLUE,))]
    if name == "mmvet":
        return [open_item(name, "v1_0", "14<OR>fourteen", category="ocr,math", meta={"capability": ["ocr", "math"]}),
                open_item(name, "v1_1", "a cat", category="rec", meta={"capability": ["rec"]}, images=(BLUE,))]
    if name == "mmvet_v2":
        return [BenchItem(name, "v2_0", "Compare <image> with <image>: which is red?", [RED, BLUE], "the first",
                          category="rec,spat", meta={"capability": ["rec", "spat"]}),
                BenchItem(name, "v2_1", "<image>\nWhat colour is this?", [GREEN], "green", category="rec",
                          meta={"capability": ["rec"]})]
    if name == "mmmu":
        return [BenchItem(name, "validation_Art_Theory_1", "Compare <image 1> and <image 2>.", [RED, BLUE], "C",
                          options={"A": "same", "B": "left", "C": "right"}, category="Art_Theory",
                          difficulty="Easy", meta={"question_type": "multiple-choice"}),
                BenchItem(name, "validation_Physics_2", "What is the force in <image 1>?", [GREEN], "12 N",
                          category="Physics", difficulty="Hard", meta={"question_type": "open"})]
    if name == "mmmu_pro":
        ten = {L: f"option {L}" for L in "ABCDEFGHIJ"}
        return [BenchItem(name, "test_Art_1", "Look at <image 1>.", [RED], "J", options=ten, category="Art",
                          difficulty="Medium", meta={"question_type": "multiple-choice"}),
                BenchItem(name, "test_Math_2", "Solve <image 1>.", [BLUE, GREEN], "A", options=dict(ABCD),
                          category="Math", difficulty="Hard", meta={"question_type": "multiple-choice"})]
    if name == "mmstar":
        return [mc(name, "1", category="coarse perception", l2_category="image emotion"),
                mc(name, "2", answer="A", category="math", l2_category="geometry", images=(BLUE,))]
    if name == "blink":
        return [mc(name, "val_Jigsaw_1", answer="A", options={"A": "the first", "B": "the second"},
                   images=(RED, BLUE, GREEN), category="Jigsaw"),
                mc(name, "val_Depth_2", answer="B", options={"A": "left", "B": "right"}, images=(RED, BLUE),
                   category="Relative_Depth")]
    if name == "seedbench":
        return [mc(name, "101", category="Scene Understanding"),
                mc(name, "102", answer="C", category="Instances Counting", images=(BLUE,))]
    if name == "seedbench2_plus":
        return [mc(name, "0", category="chart", l2_category="bar chart"),
                mc(name, "1", answer="A", category="map", l2_category="road map", images=(BLUE,))]
    if name == "realworldqa":
        return [mc(name, "0", options={"A": "left", "B": "right", "C": "straight"}, answer="C"),
                open_item(name, "1", "3", images=(BLUE,))]
    raise AssertionError(name)


def layouts(name):
    return ["tsv", "parquet"] + (["json"] if name in ("mmvet", "mmvet_v2") else [])


POSITIONAL = {"ai2d", "chartqa", "realworldqa"}  # their parquet layouts have no id column
NO_CATEGORY_PARQUET = {"ai2d", "realworldqa"}
NO_L2_PARQUET = {"ai2d", "chartqa", "realworldqa", "mmvet", "mmvet_v2", "mmmu", "mmmu_pro", "blink", "seedbench"}
META_KEYS = ("question_type", "answer_type", "precision", "unit", "choices", "capability")


@pytest.mark.parametrize("name,fmt", [(n, f) for n in BENCHMARKS for f in layouts(n)])
def test_round_trip(tmp_path, name, fmt):
    items = items_for(name)
    target = tmp_path / (f"{name}.{fmt}" if fmt != "json" else "release")
    written = write_benchmark(name, items, target, fmt)
    assert written.exists()
    got = read_benchmark(name, written)
    assert len(got) == len(items)
    for k, (want, have) in enumerate(zip(items, got)):
        where = f"{name}/{fmt} item {k}"
        expected_index = str(k) if (fmt == "parquet" and name in POSITIONAL) else want.index
        assert have.index == expected_index, where
        assert have.benchmark == name and have.row == k + 1 and have.source == str(written), where
        if name == "realworldqa" and fmt == "parquet" and want.options:  # its options live in the question
            assert have.question.startswith(want.question) and "\nA. left" in have.question, where
        else:
            assert have.question == want.question, where
        assert have.answer == want.answer, where
        assert have.options == want.options, where
        assert have.images == want.images, where
        if not (fmt == "parquet" and name in NO_CATEGORY_PARQUET):
            assert have.category == want.category, where
        if not (fmt != "tsv" and name in NO_L2_PARQUET):
            assert have.l2_category == want.l2_category, where
        assert have.difficulty == want.difficulty, where
        for key in META_KEYS:
            if key in want.meta:
                assert have.meta.get(key) == want.meta[key], (where, key)
        if fmt == "tsv" or name in ("mmbench", "mmbench_cn"):
            assert have.hint == want.hint, where
    if name in ("mmbench", "mmbench_cn"):
        assert [it.group for it in got] == ["5", "5", "7"]
    else:
        assert all(it.group == "" for it in got)


def test_protocol_fields_survive(tmp_path):
    """The fields the scorers read, spelled out for the benchmarks that have them."""
    mv = read_benchmark("mathvista", write_benchmark("mathvista", items_for("mathvista"), tmp_path / "mv.parquet",
                                                     "parquet"))
    assert mv[0].options == {"A": "1/2", "B": "3/5"} and mv[0].answer == "3/5"
    assert mv[0].meta["answer_option"] == "B" and mv[0].meta["question_type"] == "multi_choice"
    assert mv[2].meta["precision"] == 1 and mv[2].meta["unit"] == "cm" and mv[2].meta["answer_type"] == "float"
    assert mv[1].options == {} and mv[1].meta["precision"] is None
    table = pq.read_table(tmp_path / "mv.parquet")
    assert {"pid", "query", "decoded_image", "choices", "metadata"} <= set(table.column_names)
    assert table.schema.field("decoded_image").type.names == ["bytes", "path"]
    assert b"Image" in table.schema.metadata[b"huggingface"]

    mmmu = read_benchmark("mmmu", write_benchmark("mmmu", items_for("mmmu"), tmp_path / "mmmu.parquet", "parquet"))
    assert [len(it.images) for it in mmmu] == [2, 1]
    assert [it.meta["question_type"] for it in mmmu] == ["multiple-choice", "open"]
    assert [it.difficulty for it in mmmu] == ["Easy", "Hard"]
    row = pq.read_table(tmp_path / "mmmu.parquet").to_pylist()[0]
    assert row["image_2"]["bytes"] == BLUE and row["image_3"] is None and row["options"] == "['same', 'left', 'right']"

    blink = read_benchmark("blink", write_benchmark("blink", items_for("blink"), tmp_path / "b.tsv", "tsv"))
    assert [len(it.images) for it in blink] == [3, 2]
    raw = (tmp_path / "b.tsv").read_text()
    assert "['" in raw  # multi-image cell is a Python-literal list of base64 strings, as VLMEvalKit writes it
    braw = pq.read_table(write_benchmark("blink", items_for("blink"), tmp_path / "b.parquet", "parquet")).to_pylist()
    assert braw[0]["answer"] == "(A)" and braw[0]["image_4"] is None and braw[0]["choices"] == ["the first",
                                                                                               "the second"]

    vet = read_benchmark("mmvet", write_benchmark("mmvet", items_for("mmvet"), tmp_path / "vet", "json"))
    assert vet[0].meta["capability"] == ["ocr", "math"] and vet[0].category == "ocr,math"
    release = json.loads((tmp_path / "vet" / "mm-vet.json").read_text())
    assert release["v1_0"]["imagename"] == "v1_0.png" and (tmp_path / "vet" / "images" / "v1_0.png").exists()

    v2 = write_benchmark("mmvet_v2", items_for("mmvet_v2"), tmp_path / "v2" / "mm-vet-v2.json", "json")
    q = json.loads(v2.read_text())["v2_0"]["question"]
    assert q == "Compare <IMG>v2_0_0.png<IMG> with <IMG>v2_0_1.jpg<IMG>: which is red?"
    assert [len(it.images) for it in read_benchmark("mmvet_v2", tmp_path / "v2")] == [2, 1]

    ai2d = pq.read_table(write_benchmark("ai2d", items_for("ai2d"), tmp_path / "a.parquet", "parquet")).to_pylist()
    assert ai2d[1]["answer"] == "3" and ai2d[1]["options"] == list(ABCD.values())


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def tsv(path, header, rows):
    path.write_text("\n".join(["\t".join(header)] + ["\t".join(r) for r in rows]) + "\n", encoding="utf-8")
    return path


MMB_HEADER = ["index", "question", "hint", "A", "B", "C", "D", "answer", "category", "image", "l2-category",
              "split"]


def test_hand_written_mmbench_tsv_circular_copies_and_image_references(tmp_path):
    # VLMEvalKit stores a repeated image once; copies carry the index of the row holding it
    path = tsv(tmp_path / "MMBench_DEV_EN.tsv", MMB_HEADER, [
        ["5", "Which animal?", "", "cat", "dog", "None", "", "B", "attribute_recognition", b64(RED), "FP-S", "dev"],
        ["1000005", "Which animal?", "", "dog", "None", "cat", "", "A", "attribute_recognition", "5", "FP-S", "dev"],
        ["2000005", "Which animal?", "", "None", "cat", "dog", "", "C", "attribute_recognition", "5", "FP-S", "dev"],
        ["8", "What does the sign say?", "A road sign.", "NA", "STOP", "", "", "A", "ocr", b64(BLUE), "FP-C",
         "dev"],
    ])
    got = read_benchmark("mmbench", path)
    assert [it.group for it in got] == ["5", "5", "5", "8"]
    assert [it.index for it in got] == ["5", "1000005", "2000005", "8"]
    assert got[1].images == [RED] and got[2].images == [RED] and got[3].images == [BLUE]
    assert got[0].options == {"A": "cat", "B": "dog", "C": "None"}  # "None" survives as text; empty D is absent
    assert got[3].options == {"A": "NA", "B": "STOP"} and got[3].hint == "A road sign."
    assert got[0].l2_category == "FP-S" and got[0].meta["split"] == "dev" and got[3].row == 4


def test_hand_written_mmmu_tsv_with_image_list_and_open_question(tmp_path):
    images = str([b64(RED), b64(BLUE)])
    path = tsv(tmp_path / "MMMU_DEV_VAL.tsv", ["index", "question", "A", "B", "C", "answer", "category", "image",
                                              "l2_category", "split"], [
        ["1", "Compare <image 1> and <image 2>", "x", "y", "z", "B", "Art", images, "Art Theory", "validation"],
        ["2", "Give the value in <image 1>", "", "", "", "0.5", "Math", b64(GREEN), "Calculus", "validation"],
    ])
    got = read_benchmark("mmmu", path)
    assert len(got[0].images) == 2 and got[0].options == {"A": "x", "B": "y", "C": "z"}
    assert got[0].meta["question_type"] == "multiple-choice" and got[1].meta["question_type"] == "open"
    assert got[1].answer == "0.5" and got[1].options == {} and got[1].l2_category == "Calculus"


def test_options_inside_the_question_text():
    q, opts = mmstar_options("Which is right?\nOptions: A: The cat, which is black., B: The dog., C: 3, 4, D: none")
    assert q == "Which is right?" and opts == {"A": "The cat, which is black.", "B": "The dog.", "C": "3, 4",
                                               "D": "none"}
    assert mmstar_options("Is it red? Please answer yes or no.") == ("Is it red? Please answer yes or no.", {})
    q, opts = line_options("Which way?\nA. left\nB. right\nPlease answer directly with only the letter.")
    assert opts == {"A": "left", "B": "right"} and q == "Which way?\nPlease answer directly with only the letter."
    assert line_options("How many cars?\nA. is not an option list") == ("How many cars?\nA. is not an option list",
                                                                         {})
    assert split_markers("<IMG><image_0.png>What is it?") == ("<image>What is it?", ["image_0.png"])


def test_realworldqa_parquet_with_listed_options_and_text_gold(tmp_path):
    import pyarrow as pa

    img = {"bytes": RED, "path": "0.png"}
    table = pa.table({"question": ["Which way?\nA. left\nB. right\nPlease answer with the letter.", "How many?"],
                      "answer": ["right", "4"], "image": [img, img]})
    pq.write_table(table, tmp_path / "rwqa.parquet")
    got = read_benchmark("realworldqa", tmp_path / "rwqa.parquet")
    assert got[0].options == {"A": "left", "B": "right"} and got[0].answer == "B"
    assert got[1].options == {} and got[1].answer == "4"


def test_mmmu_parquet_list_typed_answer_lists_every_accepted_answer(tmp_path):
    import pyarrow as pa

    def one(gold, answer_type):
        table = pa.table({"id": ["validation_Math_1"], "question": ["How many?"], "options": ["[]"],
                          "answer": pa.array([gold], answer_type), "question_type": ["open"],
                          "image_1": [{"bytes": RED, "path": "1.png"}]})
        pq.write_table(table, tmp_path / "mmmu.parquet")
        return read_benchmark("mmmu", tmp_path / "mmmu.parquet")[0]

    listed = one(["3", "three"], pa.list_(pa.string()))
    assert listed.meta["answers"] == ["3", "three"] and listed.answer == "['3', 'three']"
    written = one("['3', 'three']", pa.string())   # a text cell stays one string gold
    assert "answers" not in written.meta and written.answer == "['3', 'three']"


def test_undecodable_images_name_every_row(tmp_path):
    path = tsv(tmp_path / "AI2D_TEST.tsv", ["index", "image", "question", "A", "B", "answer"], [
        ["10", b64(RED), "ok?", "yes", "no", "A"],
        ["11", b64(b"not an image at all, just text bytes"), "q", "yes", "no", "A"],
        ["12", "%%%not base64%%%", "q", "yes", "no", "B"],
        ["13", str([b64(RED), b64(b"\x89PNG broken")]), "q", "yes", "no", "B"],
    ])
    with pytest.raises(UserFacingError) as exc:
        read_benchmark("ai2d", path)
    msg = str(exc.value)
    assert str(path) in msg and "column 'image'" in msg and "3 row(s)" in msg
    assert "row 2 (index 11)" in msg and "row 3 (index 12)" in msg and "row 4 (index 13)" in msg
    assert "image 2 of 2" in msg and "row 1 (index 10)" not in msg


def test_missing_column_lists_present_and_expected(tmp_path):
    path = tsv(tmp_path / "SEEDBench_IMG.tsv", ["index", "image", "question", "A", "B"],
               [["1", b64(RED), "q", "x", "y"]])
    with pytest.raises(UserFacingError) as exc:
        read_benchmark("seedbench", path)
    msg = str(exc.value)
    assert "missing column(s) ['answer']" in msg and "present: ['index', 'image', 'question', 'A', 'B']" in msg
    pq.write_table(pq.read_table(write_benchmark("blink", items_for("blink"), tmp_path / "b.parquet", "parquet"))
                   .drop(["choices"]), tmp_path / "b2.parquet")
    with pytest.raises(UserFacingError, match=r"missing column\(s\) \['choices'\] for the lmms-eval parquet"):
        read_benchmark("blink", tmp_path / "b2.parquet")


def test_answer_letter_beyond_the_options(tmp_path):
    path = tsv(tmp_path / "MMStar.tsv", ["index", "image", "question", "A", "B", "C", "D", "answer", "category"], [
        ["1", b64(RED), "q1", "a", "b", "c", "d", "E", "math"],
        ["2", b64(RED), "q2", "a", "b", "", "", "C", "math"],
        ["3", b64(RED), "q3", "a", "b", "c", "d", "(B)", "math"],
    ])
    with pytest.raises(UserFacingError) as exc:
        read_benchmark("mmstar", path)
    msg = str(exc.value)
    assert "column 'answer': 2 row(s)" in msg
    assert "row 1 (index 1): answer 'E' but the options are A,B,C,D" in msg
    assert "row 2 (index 2): answer 'C' but the options are A,B" in msg and "row 3" not in msg


def test_lower_case_and_padded_gold_letters_are_normalised(tmp_path):
    path = tsv(tmp_path / "MMStar.tsv", ["index", "image", "question", "A", "B", "C", "D", "answer", "category"], [
        ["1", b64(RED), "q1", "a", "b", "c", "d", "b", "math"],
        ["2", b64(RED), "q2", "a", "b", "c", "d", " C ", "math"],
        ["3", b64(RED), "q3", "a", "b", "c", "d", "(d)", "math"],
        ["4", b64(RED), "q4", "a", "b", "c", "d", "a.", "math"],
    ])
    assert [it.answer for it in read_benchmark("mmstar", path)] == ["B", "C", "D", "A"]


def test_missing_file_says_where_to_put_it(tmp_path):
    where = tmp_path / "benchmarks" / "mmbench.tsv"
    with pytest.raises(UserFacingError) as exc:
        read_benchmark("mmbench", where)
    msg = str(exc.value)
    assert f"place the VLMEvalKit TSV (e.g. MMBench_DEV_EN.tsv) or the lmms-eval parquet for mmbench at {where}" \
        in msg and "params.yaml under evaluate.benchmarks" in msg
    with pytest.raises(UserFacingError, match="mm-vet.json with its images/ folder"):
        read_benchmark("mmvet", tmp_path / "nowhere")


def test_duplicates_empty_questions_and_the_count_past_ten(tmp_path):
    rows = [[str(i), b64(RED), f"q{i}" if i != 4 else "  ", "a", "b", "A"] for i in range(1, 15)]
    rows.append(["3", b64(RED), "again", "a", "b", "A"])
    rows += [[str(100 + i), b64(b"junk"), "q", "a", "b", "A"] for i in range(12)]
    path = tsv(tmp_path / "BLINK.tsv", ["index", "image", "question", "A", "B", "answer"], rows)
    with pytest.raises(UserFacingError) as exc:
        read_benchmark("blink", path)
    msg = str(exc.value)
    assert "column 'question': 1 row(s)" in msg and "row 4 (index 4): empty" in msg
    assert "column 'index': 2 row(s)" in msg and "row 3 (index 3): also on row(s) 15" in msg
    assert "column 'image': 12 row(s)" in msg and "and 2 more" in msg


def test_mmvet_release_with_a_missing_image(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "v1_0.png").write_bytes(RED)
    (tmp_path / "mm-vet.json").write_text(json.dumps({
        "v1_0": {"imagename": "v1_0.png", "capability": ["rec"], "question": "What?", "answer": "cat"},
        "v1_1": {"imagename": "v1_1.png", "capability": ["ocr"], "question": "Read it", "answer": "STOP"}}))
    with pytest.raises(UserFacingError) as exc:
        read_benchmark("mmvet", tmp_path / "mm-vet.json")
    assert "row 2 (index v1_1)" in str(exc.value) and "image file not found" in str(exc.value)


def test_unknown_benchmark_and_format(tmp_path):
    with pytest.raises(UserFacingError, match="unknown benchmark 'mme'"):
        read_benchmark("mme", tmp_path / "x.tsv")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(UserFacingError, match="cannot tell the format"):
        read_benchmark("ai2d", tmp_path / "x.csv")
    with pytest.raises(UserFacingError, match="has no JSON layout"):
        read_benchmark("ai2d", tmp_path / "x.csv", fmt="json")
