"""Users' dataset layouts read as they come (protege.data.layouts), and the data stage's checks before any
compute (protege.stages.data). Every file here is written by the test, images included."""
import base64
import io
import json

import pandas as pd
import pytest
from PIL import Image

from protege.config import Config
from protege.data.importers import file_frame
from protege.data.layouts import OPTIONS_HINT, read_file
from protege.data.validate import DatasetInvalid


def png(rgb=(200, 0, 0), k=0) -> bytes:
    im = Image.new("RGB", (16, 16), rgb)
    im.putpixel((k % 16, k // 16 % 16), (0, 0, 0))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_llava_first_turn_target_and_answer(tmp_path):
    recs = [{"id": "a", "image": "x.png", "conversations": [
                {"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A red square."},
                {"from": "human", "value": "Sure?"}, {"from": "gpt", "value": "Yes."}], "answer": "red"},
            {"id": "b", "images": ["x.png", "y.png"], "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which is bigger?"}]},
                {"role": "assistant", "content": "The left one"}]}]
    out = read_file(jsonl(tmp_path / "t.jsonl", recs))
    assert [(r.id, r.question, r.answer, r.target) for r in out] == [
        ("a", "What is it?", "red", "A red square."), ("b", "Which is bigger?", "The left one", "The left one")]
    assert out[1].images == ["x.png", "y.png"]


def test_llava_json_list_and_a_record_without_a_reply(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"id": "a", "image": "x.png", "conversations": [{"from": "human", "value": "Q?"}]}]))
    (rec,) = read_file(path)
    assert rec.error == "no human turn followed by an assistant turn" and rec.source == "t.json:record 0"


def test_verl_prompt_messages_images_and_reward_model(tmp_path):
    df = pd.DataFrame([{"data_source": "geo", "prompt": [{"role": "system", "content": "Think."},
                                                         {"role": "user", "content": "<image>Find x."}],
                        "images": [{"bytes": png(), "path": None}], "reward_model": {"style": "rule", "ground_truth": "12"},
                        "extra_info": {"index": 0}}])
    df.to_parquet(tmp_path / "rl.parquet")
    (rec,) = read_file(tmp_path / "rl.parquet")
    assert (rec.question, rec.answer, rec.id) == ("Find x.", "12", None)
    assert rec.images[0]["bytes"] == png()
    frame = file_frame(tmp_path / "rl.parquet")
    assert frame["id"][0] == "rl.parquet:row 0"   # no id column: file and row


def test_easyr1_problem_paths_and_numbers_as_text(tmp_path):
    pd.DataFrame([{"problem": "<image>How many?", "images": ["a.png", "b.png"], "answer": 3.0}]).to_parquet(
        tmp_path / "t.parquet")
    (rec,) = read_file(tmp_path / "t.parquet")
    assert (rec.question, rec.answer, rec.images) == ("How many?", "3", ["a.png", "b.png"])


@pytest.mark.parametrize("options, answer, letter", [
    (["cat", "dog", "cow"], "dog", "B"),            # a list column, the answer as the option's text
    ('["cat", "dog", "cow"]', "(c)", "C"),          # a JSON list, a lettered answer in another form
    ("['cat', 'dog', 'cow']", "A", "A"),            # a Python list literal (HF exports of MMMU)
])
def test_options_as_a_list_column(tmp_path, options, answer, letter):
    pd.DataFrame([{"id": "1", "question": "Which animal?", "image": png(), "options": options,
                   "answer": answer}]).to_parquet(tmp_path / "t.parquet")
    (rec,) = read_file(tmp_path / "t.parquet")
    assert rec.options == ["cat", "dog", "cow"] and rec.answer == letter
    assert rec.question == f"Which animal?\nA. cat\nB. dog\nC. cow\n{OPTIONS_HINT}"


def test_lettered_option_columns_hf_image_struct_and_category(tmp_path):
    b64 = base64.b64encode(png()).decode()
    pd.DataFrame([{"index": 7, "question": "Q?\nA. up\nB. down", "A": "up", "B": "down", "C": None, "D": None,
                   "answer": "B", "category": "direction", "image": b64}]).to_parquet(tmp_path / "mmb.parquet")
    (rec,) = read_file(tmp_path / "mmb.parquet")
    assert (rec.id, rec.options, rec.answer, rec.kind) == ("7", ["up", "down"], "B", "direction")
    assert rec.question == "Q?\nA. up\nB. down"       # already lists its options: left as it is


def test_columns_mapping_and_a_mapped_column_the_file_lacks(tmp_path):
    pd.DataFrame([{"qid": "q1", "ask": "Colour?", "gold": "red", "pic": png()}]).to_parquet(tmp_path / "t.parquet")
    mapping = {"question": "ask", "answer": "gold", "image": "pic", "id": "qid"}
    (rec,) = read_file(tmp_path / "t.parquet", mapping)
    assert (rec.id, rec.question, rec.answer) == ("q1", "Colour?", "red") and rec.images == [png()]
    with pytest.raises(DatasetInvalid, match=r"t.parquet: no column 'picture' \(data.columns.image: 'picture'\); "
                                             r"the file has ask, gold, pic, qid"):
        read_file(tmp_path / "t.parquet", {**mapping, "image": "picture"})
    with pytest.raises(DatasetInvalid, match="no question column: expected one of question, problem"):
        read_file(tmp_path / "t.parquet")


def test_several_images_are_stored_once_each(tmp_path):
    from protege.data.importers import import_dataset

    pd.DataFrame([{"id": "1", "question": "Same?", "answer": "no", "images": [png((1, 2, 3)), png((4, 5, 6))]},
                  {"id": "2", "question": "Same again?", "answer": "yes", "images": [png((1, 2, 3))]}]).to_parquet(
        tmp_path / "t.parquet")
    res = import_dataset(tmp_path / "t.parquet", "auto", tmp_path / "out", "t")
    df = pd.read_parquet(res.table)
    assert res.images_written == 2 and df["image"][0] == df["image"][1]
    assert len(json.loads(df["extra_images"][0])) == 1 and json.loads(df["extra_images"][1]) == []


# --- the data stage's checks --------------------------------------------------------------------------

class NoRun:
    def log_params(self, *a, **k): pass
    def log_input(self, *a, **k): pass
    def log_metrics(self, *a, **k): pass


def files_cfg(tmp_path, **data) -> Config:
    return Config(data={"source": "files", **data}, model={"path": str(tmp_path / "model")})


def qa_table(path, ids, answers=None, start=0):
    pd.DataFrame([{"id": i, "question": f"Colour {i}?", "answer": (answers or {}).get(i, "red"),
                   "image": png(k=start + n)} for n, i in enumerate(ids)]).to_parquet(path)
    return path.name


def test_the_data_stage_writes_every_split_and_keeps_the_last_import_when_one_fails(tmp_path):
    from protege.stages import data

    qa_table(tmp_path / "train.parquet", ["t1", "t2"])
    qa_table(tmp_path / "rl.parquet", ["r1", "r2", "r3"], start=10)
    qa_table(tmp_path / "test.parquet", ["e1"], start=20)
    cfg = files_cfg(tmp_path, train="train.parquet", rl="rl.parquet", test="test.parquet")
    data.run(cfg, tmp_path, NoRun())
    assert [len(pd.read_parquet(tmp_path / f"data/imported/{s}.parquet")) for s in ("train", "rl", "test")] == [2, 3, 1]
    assert not (tmp_path / "data/imported/val.parquet").exists() and (tmp_path / "data/pool").is_dir()
    before = sorted(p.name for p in (tmp_path / "data/imported").rglob("*"))

    qa_table(tmp_path / "rl.parquet", ["r1", "t2"], start=10)          # t2 is also a train question
    with pytest.raises(DatasetInvalid, match=r"1 question id\(s\) in two splits: id 't2' in data.train "
                                             r"\(train.parquet:row 1\) and data.rl \(rl.parquet:row 1\)"):
        data.run(cfg, tmp_path, NoRun())
    assert sorted(p.name for p in (tmp_path / "data/imported").rglob("*")) == before   # nothing lost
    assert not list((tmp_path / "data").glob(".imported.*"))


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, r"rl.parquet: file not found"),
    (lambda p: (p / "rl.parquet").write_bytes(b""), r"rl.parquet: not a readable parquet table"),
    (lambda p: (p / "rl").mkdir(), r"a folder with no dataset file in it"),
    (lambda p: (p / "rl.csv").write_text("a,b\n"), r"rl.csv: unknown layout \(suffix '.csv'\)"),
    (lambda p: pd.DataFrame({"question": [], "answer": [], "image": []}).to_parquet(p / "rl.parquet"),
     r"data.rl: .*rl.parquet: no rows"),
    (lambda p: qa_table(p / "rl.parquet", ["r1", "r2"], {"r2": None}), r"data.rl: 1 question\(s\) without an "
                                                                      r"answer: rl.parquet:row 1 \(id 'r2'\)"),
])
def test_a_bad_split_stops_the_data_stage_naming_it(tmp_path, setup, message):
    from protege.stages import data

    qa_table(tmp_path / "train.parquet", ["t1"])
    qa_table(tmp_path / "test.parquet", ["e1"], start=5)
    setup(tmp_path)
    rl = "rl.csv" if (tmp_path / "rl.csv").exists() else "rl" if (tmp_path / "rl").is_dir() else "rl.parquet"
    cfg = files_cfg(tmp_path, train="train.parquet", rl=rl, test="test.parquet")
    with pytest.raises(DatasetInvalid, match=message):
        data.run(cfg, tmp_path, NoRun())
    assert not (tmp_path / "data/imported").exists()


def test_the_config_names_what_files_need():
    with pytest.raises(ValueError, match="data.source is files: set data.train, data.rl, data.test"):
        Config(data={"source": "files"}, model={"path": "m"})
    with pytest.raises(ValueError, match="set model.path"):
        Config(data={"source": "files", "train": "a", "rl": "b", "test": "c"})
    with pytest.raises(ValueError, match=r"data.columns: unknown field\(s\) \['prompt'\]"):
        Config(data={"columns": {"prompt": "p"}})


def test_the_world_stage_refuses_to_run_for_files(tmp_path):
    from protege.errors import UserFacingError
    from protege.stages import world

    cfg = files_cfg(tmp_path, train="a", rl="b", test="c")
    with pytest.raises(UserFacingError, match="run `protege dag`"):
        world.run(cfg, tmp_path, NoRun())


def test_images_inside_message_parts_and_an_answer_given_as_the_options_index(tmp_path):
    recs = [{"id": "q", "messages": [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "Which?"}]},
        {"role": "assistant", "content": "B"}]}]
    (rec,) = read_file(jsonl(tmp_path / "m.jsonl", recs))
    assert rec.images == ["a.png"] and rec.question == "Which?"
    pd.DataFrame([{"question": "Which one?", "choices": ["3", "5", "7"], "answer": 2, "image": png()}]).to_parquet(
        tmp_path / "sqa.parquet")
    assert read_file(tmp_path / "sqa.parquet")[0].answer == "C"                      # ScienceQA: an index
    pd.DataFrame([{"question": "Which two?", "choices": ["3", "5", "7"], "answer": "1", "image": png()}]).to_parquet(
        tmp_path / "txt.parquet")
    assert read_file(tmp_path / "txt.parquet")[0].answer == "B"                      # "1": no option says it
