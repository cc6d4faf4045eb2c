"""A teacher cache someone (or something) broke: every shard verified against the index, a malformed or
missing index rebuilt from the shards that prove they are the cache's own, anything else quarantined and
its answers asked again, each recorded (a `Repair`: the file relative to the cache folder, why, the answers
dropped and how many a fill asked again) for the teachers stage to print and count."""
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
def test_malformed_index_is_rebuilt_and_nothing_is_asked_again(filled, index_text):
    cache, folder = filled
    (folder / "index.json").write_text(index_text, encoding="latin-1")
    assert len(cache.load("concise")) == 6
    [line] = cache.recovered
    assert line.startswith("cache index concise/index.json malformed (") and line.endswith(
        "): rebuilt from 2 shards that prove they are the cache's own"), line
    index = json.loads((folder / "index.json").read_text())
    assert sorted(index["shards"]) == ["shard-000000.parquet", "shard-000001.parquet"]
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(6))["requested"] == 0 and teacher.asked == 0


def test_foreign_parquet_is_quarantined_not_adopted(filled):
    cache, folder = filled
    foreign = pd.DataFrame([{c: "x" for c in COLUMNS}])
    foreign.to_parquet(folder / "shard-000002.parquet")
    pd.DataFrame({"a": [1]}).to_parquet(folder / "notes.parquet")
    assert len(cache.load("concise")) == 6
    out = "\n".join(cache.recovered)
    assert ("cache shard concise/shard-000002.parquet distrusted (no digest: not a shard written by protege's "
            "teacher cache") in out
    assert "cache shard concise/notes.parquet distrusted (misnamed: not named like a cache shard" in out
    assert (folder / "corrupt" / "shard-000002.parquet").exists() and not (folder / "shard-000002.parquet").exists()


def test_edited_answer_with_the_index_deleted_is_not_kept(filled):
    cache, folder = filled
    shard = folder / "shard-000001.parquet"
    table = pq.read_table(shard)
    df = table.to_pandas()
    df.loc[0, "answer"] = "3"
    pq.write_table(pa_table_with(df, table.schema.metadata), shard)   # metadata copied, answer edited
    (folder / "index.json").unlink()
    assert len(cache.load("concise")) == 3
    # the index rebuilt, then the shard: why, which answers it dropped, where it went
    assert cache.recovered == [
        "cache index concise/index.json missing: rebuilt from 1 shard that proves it is the cache's own",
        "cache shard concise/shard-000001.parquet distrusted (digest mismatch: its answers differ from what the "
        "cache wrote (edited)): 3 answers dropped (q3 sample 0, q4 sample 0, q5 sample 0), asked again when next "
        "wanted; moved to concise/corrupt/shard-000001.parquet"]
    assert (folder / "corrupt" / "shard-000001.parquet").exists()
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(6))["requested"] == 3 and teacher.asked == 3
    assert cache.repairs[1].re_asked == 3 and cache.recovered[1].endswith(
        "3 answers dropped (q3 sample 0, q4 sample 0, q5 sample 0), all 3 re-asked; moved to "
        "concise/corrupt/shard-000001.parquet")


def test_edited_shard_listed_in_the_index_fails_its_checksum(filled):
    cache, folder = filled
    shard = folder / "shard-000000.parquet"
    df = pd.read_parquet(shard)
    df.loc[0, "answer"] = "3"
    df.to_parquet(shard)
    assert len(cache.load("concise")) == 3
    assert cache.recovered == [
        "cache shard concise/shard-000000.parquet distrusted (digest mismatch: checksum differs from the index): "
        "3 answers dropped (q0 sample 0, q1 sample 0, q2 sample 0), asked again when next wanted; moved to "
        "concise/corrupt/shard-000000.parquet"]


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


def test_a_copied_shard_is_quarantined_and_fills_go_on(filled):
    cache, folder = filled
    (folder / "shard-000000 (copy).parquet").write_bytes((folder / "shard-000000.parquet").read_bytes())
    assert len(cache.load("concise")) == 6
    assert cache.recovered == [
        "cache shard concise/shard-000000 (copy).parquet distrusted (misnamed: not named like a cache shard "
        "(shard-NNNNNN.parquet)): nothing dropped, every answer it held is in another shard; moved to "
        "concise/corrupt/shard-000000 (copy).parquet"]
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(8))["requested"] == 2


# ---- the teachers stage: what it prints and logs about the repairs ---------------------------------------

class Recording:
    """Stands in for the stage's MLflow run: keeps the metrics it logs."""

    def __init__(self):
        self.metrics = {}

    def log_metrics(self, metrics, step=None):
        self.metrics.update(metrics)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


@pytest.fixture(scope="module")
def stage_project(tmp_path_factory):
    """A tiny project whose teachers stage has run once (the world's rl split stands in for curate's pick)."""
    import shutil

    import yaml

    from protege.config import Config
    from protege.paths import CURATED, WORLD
    from protege.stages import teachers, world
    from tests.conftest import REPO

    proj = tmp_path_factory.mktemp("teachers_stage")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["world"].update({"n_train": 16, "n_rl": 6, "n_val": 4, "n_test": 4})
    params["teachers"]["answers_per_question"] = 2
    cfg = Config.model_validate(params)
    world.run(cfg, proj, Recording())
    shutil.copytree(proj / WORLD, proj / CURATED)  # data/curated/rl.parquet and its images
    teachers.run(cfg, proj, Recording())
    return cfg, proj


def run_teachers(stage_project, capsys):
    from protege.stages import teachers

    cfg, proj = stage_project
    capsys.readouterr()
    run = Recording()
    teachers.run(cfg, proj, run)
    printed = capsys.readouterr().err  # say() prints on stderr
    written = json.loads((proj / "reports/stages/teachers.json").read_text())
    return proj / "data/teachers", printed, run.metrics, written


def test_the_stage_reports_no_repair_for_a_healthy_cache(stage_project, capsys):
    cache, printed, logged, written = run_teachers(stage_project, capsys)
    zeros = {"cache_shards_repaired": 0, "cache_indexes_rebuilt": 0, "cache_answers_dropped": 0,
             "cache_answers_reasked": 0}
    assert {k: logged[k] for k in zeros} == zeros and {k: written[k] for k in zeros} == zeros
    assert "cache shard" not in printed and "cache index" not in printed and "repaired" not in printed, printed
    assert logged["concise.requested"] == 0 and logged["verbose.requested"] == 0


def test_the_stage_names_the_shard_it_distrusted_and_what_it_dropped(stage_project, capsys):
    """As measured: the index deleted and one cached answer edited (the shard's own metadata kept)."""
    cache, _, _, _ = run_teachers(stage_project, capsys)
    shard = cache / "concise" / "shard-000000.parquet"
    table = pq.read_table(shard)
    df = table.to_pandas()
    held = len(df)
    df.loc[0, "answer"] = df.loc[0, "answer"] + " (edited)"
    pq.write_table(pa_table_with(df, table.schema.metadata), shard)
    (cache / "concise" / "index.json").unlink()

    _, printed, logged, written = run_teachers(stage_project, capsys)
    assert ("teachers cache index data/teachers/concise/index.json missing: rebuilt from 0 shards (none proves it "
            "is the cache's own)") in printed, printed
    line = next(x for x in printed.splitlines() if "cache shard" in x)
    assert line.startswith("teachers cache shard data/teachers/concise/shard-000000.parquet distrusted (digest "
                           "mismatch: its answers differ from what the cache wrote (edited)): "
                           f"{held} answers dropped ({df.loc[0, 'question_id']} sample 0, "), line
    assert line.endswith(f"and {held - 5} more), all {held} re-asked; moved to "
                         "data/teachers/concise/corrupt/shard-000000.parquet"), line
    assert (f"cache repaired: 1 shard(s) distrusted, 1 index(es) rebuilt, {held} answer(s) dropped, {held} "
            "re-asked") in printed
    counts = {"cache_shards_repaired": 1, "cache_indexes_rebuilt": 1, "cache_answers_dropped": held,
              "cache_answers_reasked": held}
    assert {k: logged[k] for k in counts} == counts and {k: written[k] for k in counts} == counts
    assert logged["concise.requested"] == held and logged["verbose.requested"] == 0
    # repaired: the next run finds nothing to repair and asks nothing
    _, printed, logged, _ = run_teachers(stage_project, capsys)
    assert "cache shard" not in printed and logged["cache_shards_repaired"] == 0 and logged["concise.requested"] == 0
