"""A teacher cache someone (or something) broke: every shard verified against the index, a malformed or
missing index rebuilt from the shards that prove they are the cache's own, anything else quarantined and
its answers asked again, each reported with the file and what was done."""
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from protege.teachers.backends import TeacherRequest
from protege.teachers.cache import COLUMNS, TeacherCache, cache_key
from protege.teachers.digest import weights_digest
from tests.unit.test_teacher_cache import Counting


def requests(n):
    return [TeacherRequest(cache_key("concise", "v1", f"prompt {i}", "img", {}, 0), f"q{i}", f"prompt {i}", None,
                           "count", "2", ("1", "2", "3"), 0) for i in range(n)]


@pytest.fixture
def filled(tmp_path):
    cache = TeacherCache(tmp_path, flush_every=3)
    cache.fill(Counting("concise", 0.0, 0), requests(6))   # two shards of three
    return cache, tmp_path / "concise"


@pytest.mark.parametrize("index_text", ["[]", '{"shards": []}', '{"shards": {"shard-000000.parquet": 3}}',
                                        '{"shards": {"shard-000000.parquet": {"rows": 3}}}', "{", "\xff", ""])
def test_malformed_index_is_rebuilt_and_nothing_is_asked_again(filled, capsys, index_text):
    cache, folder = filled
    (folder / "index.json").write_text(index_text, encoding="latin-1")
    assert len(cache.load("concise")) == 6
    assert "index.json is malformed" in capsys.readouterr().out
    index = json.loads((folder / "index.json").read_text())
    assert sorted(index["shards"]) == ["shard-000000.parquet", "shard-000001.parquet"]
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(6))["requested"] == 0 and teacher.asked == 0


def test_foreign_parquet_is_quarantined_not_adopted(filled, capsys):
    cache, folder = filled
    foreign = pd.DataFrame([{c: "x" for c in COLUMNS}])
    foreign.to_parquet(folder / "shard-000002.parquet")
    pd.DataFrame({"a": [1]}).to_parquet(folder / "notes.parquet")
    assert len(cache.load("concise")) == 6
    out = capsys.readouterr().out
    assert "shard-000002.parquet rejected (not a shard written by protege's teacher cache" in out
    assert "notes.parquet rejected (not named like a cache shard" in out
    assert (folder / "corrupt" / "shard-000002.parquet").exists() and not (folder / "shard-000002.parquet").exists()


def test_edited_answer_with_the_index_deleted_is_not_kept(filled, capsys):
    cache, folder = filled
    shard = folder / "shard-000001.parquet"
    table = pq.read_table(shard)
    df = table.to_pandas()
    df.loc[0, "answer"] = "3"
    pq.write_table(pa_table_with(df, table.schema.metadata), shard)   # metadata copied, answer edited
    (folder / "index.json").unlink()
    assert len(cache.load("concise")) == 3
    out = capsys.readouterr().out
    assert f"{folder / 'index.json'} is missing; rebuilding it" in out
    assert "its answers differ from what the cache wrote (edited)" in out
    # the shard, where it went, and which answers are asked again
    assert (f"{shard} rejected" in out and f"moved to {folder / 'corrupt' / 'shard-000001.parquet'}" in out
            and "3 answer(s) will be asked again: q3 sample 0, q4 sample 0, q5 sample 0" in out), out
    assert len(cache.recovered) == 2
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(6))["requested"] == 3 and teacher.asked == 3


def test_edited_shard_listed_in_the_index_fails_its_checksum(filled, capsys):
    cache, folder = filled
    shard = folder / "shard-000000.parquet"
    df = pd.read_parquet(shard)
    df.loc[0, "answer"] = "3"
    df.to_parquet(shard)
    assert len(cache.load("concise")) == 3
    assert "checksum differs from the index" in capsys.readouterr().out


def test_weights_digest_follows_the_bytes_not_the_path(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"weights v1")
    (tmp_path / "config.json").write_text("{}")
    first = weights_digest(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"weights v2")
    assert weights_digest(tmp_path) != first
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(Exception, match="no \\*.safetensors weights"):
        weights_digest(tmp_path)


def pa_table_with(df, metadata):
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(metadata)


def test_a_copied_shard_is_quarantined_and_fills_go_on(filled, capsys):
    cache, folder = filled
    (folder / "shard-000000 (copy).parquet").write_bytes((folder / "shard-000000.parquet").read_bytes())
    assert len(cache.load("concise")) == 6
    assert "shard-000000 (copy).parquet rejected (not named like a cache shard" in capsys.readouterr().out
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(8))["requested"] == 2
