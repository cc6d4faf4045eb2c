"""The teacher cache: content keys, resumable shards, corrupt-shard recovery, HTTP retries."""
import pytest

from protege.teachers.backends import SamplingParams, ScriptedTeacher, TeacherRequest
from protege.teachers.cache import TeacherCache, TeacherCacheIncomplete, cache_key
from protege.loopback_server import ServerBehaviour, serve_in_thread
from protege.teachers.openai_backend import OpenAITeacher


class Counting(ScriptedTeacher):
    def __post_init__(self):
        super().__post_init__()
        self.asked = 0

    def run(self, requests, on_outcome):
        self.asked += len(requests)
        super().run(requests, on_outcome)


def requests(n, teacher="concise", per_question=2):
    return [TeacherRequest(cache_key(teacher, "v1", f"prompt {i}", "img", {"t": 1.0}, k), f"q{i}", f"prompt {i}",
                           None, "count", "2", ("1", "2", "3"), k) for i in range(n) for k in range(per_question)]


def test_key_depends_on_every_part():
    base = cache_key("t", "r", "p", "h", {"t": 1}, 0)
    assert len({base, cache_key("u", "r", "p", "h", {"t": 1}, 0), cache_key("t", "s", "p", "h", {"t": 1}, 0),
                cache_key("t", "r", "q", "h", {"t": 1}, 0), cache_key("t", "r", "p", "i", {"t": 1}, 0),
                cache_key("t", "r", "p", ["h", "i"], {"t": 1}, 0), cache_key("t", "r", "p", "h", {"t": 2}, 0),
                cache_key("t", "r", "p", "h", {"t": 1}, 1)}) == 8


def test_refill_asks_nothing_and_extends_only_missing(tmp_path):
    cache = TeacherCache(tmp_path, flush_every=4)
    teacher = Counting("concise", error_rate=0.0, seed=0)
    assert cache.fill(teacher, requests(3))["requested"] == 6
    assert cache.fill(teacher, requests(3))["requested"] == 0
    assert teacher.asked == 6
    assert cache.fill(teacher, requests(5))["requested"] == 4
    df = cache.load("concise")
    assert len(df) == 10 and df["key"].is_unique
    assert len(list((tmp_path / "concise").glob("shard-*.parquet"))) == 3  # 4 + 2, then 4


def test_corrupt_shard_is_quarantined_and_its_keys_asked_again(tmp_path):
    cache = TeacherCache(tmp_path, flush_every=4)
    teacher = Counting("concise", error_rate=0.0, seed=0)
    cache.fill(teacher, requests(4))  # 8 answers -> 2 shards
    first = sorted((tmp_path / "concise").glob("shard-*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:50])  # torn
    assert len(cache.load("concise")) == 4
    [repair] = cache.repairs
    assert (repair.file, repair.reason, repair.dropped) == (f"concise/{first.name}", "digest mismatch", 4)
    assert cache.recovered == [f"cache shard concise/{first.name} distrusted (digest mismatch: checksum differs "
                               "from the index): 4 answers dropped (unreadable, so which ones is unknown); any this "
                               f"run wants that no other shard holds are asked again; moved to concise/corrupt/"
                               f"{first.name}"]
    stats = cache.fill(teacher, requests(4))
    assert stats["requested"] == 4
    df = cache.load("concise")
    assert len(df) == 8 and df["key"].is_unique and (tmp_path / "concise" / "corrupt" / first.name).exists()


def test_shard_without_index_entry_is_adopted(tmp_path):
    cache = TeacherCache(tmp_path, flush_every=100)
    cache.fill(Counting("concise", 0.0, 0), requests(2))
    (tmp_path / "concise" / "index.json").unlink()  # killed between the shard rename and the index write
    teacher = Counting("concise", 0.0, 0)
    assert cache.fill(teacher, requests(2))["requested"] == 0 and teacher.asked == 0


def http_teacher(url, **kw):
    return OpenAITeacher("remote", url, "loopback", SamplingParams(max_tokens=16), api_key_env=None,
                         concurrency=4, timeout_s=5, backoff_base_s=0.01, **kw)


def test_server_errors_then_recovery_lose_nothing(tmp_path):
    behaviour = ServerBehaviour(fail_first=6)
    with serve_in_thread(behaviour) as url:
        teacher = http_teacher(url, max_retries=4)
        stats = TeacherCache(tmp_path, flush_every=3).fill(teacher, requests(5, "remote"))
    assert stats["received"] == 10 and stats["failures"] == 0
    assert behaviour.counts["failed"] == 6 and teacher.requests_sent == 16
    df = TeacherCache(tmp_path).load("remote")
    assert len(df) == 10 and df["answer"].str.startswith("Looking closely").all()
    assert (df["finish_reason"] == "stop").all() and (df["completion_tokens"] > 0).all()


def test_server_that_never_recovers_fails_with_count_and_keeps_answers(tmp_path):
    behaviour = ServerBehaviour(fail_after=7)
    with serve_in_thread(behaviour) as url:
        with pytest.raises(TeacherCacheIncomplete) as err:
            TeacherCache(tmp_path, flush_every=2).fill(http_teacher(url, max_retries=2), requests(6, "remote"))
    assert err.value.missing == 5 and err.value.total == 12
    assert "5 of 12 answers still missing" in str(err.value)
    assert len(TeacherCache(tmp_path).load("remote")) == 7
    # once the server is healthy again, only the 5 missing are asked
    with serve_in_thread(ServerBehaviour()) as url:
        teacher = http_teacher(url)
        stats = TeacherCache(tmp_path).fill(teacher, requests(6, "remote"))
    assert stats["requested"] == 5 and teacher.requests_sent == 5


def test_client_errors_are_not_retried(tmp_path):
    behaviour = ServerBehaviour(fail_first=100, status_on_failure=400)
    with serve_in_thread(behaviour) as url:
        teacher = http_teacher(url, max_retries=5)
        with pytest.raises(TeacherCacheIncomplete, match="HTTP 400"):
            TeacherCache(tmp_path).fill(teacher, requests(1, "remote", per_question=1))
    assert teacher.requests_sent == 1


def test_backoff_grows_exponentially_with_jitter():
    t = OpenAITeacher("x", "http://127.0.0.1:1/v1", "m", backoff_base_s=1.0, backoff_cap_s=100)
    waits = [t.backoff(a) for a in range(5)]
    for a, w in enumerate(waits):
        assert 0.5 * 2 ** a <= w < 1.5 * 2 ** a
    assert t.backoff(20) < 150


def test_changing_a_scripted_teachers_error_rate_or_seed_asks_it_again(tmp_path):
    revisions = {ScriptedTeacher("concise", e, s).revision for e, s in ((0.1, 0), (0.3, 0), (0.1, 1))}
    assert len(revisions) == 3
    cache = TeacherCache(tmp_path)
    for error_rate in (0.0, 1.0):
        teacher = Counting("concise", error_rate, 0)
        reqs = [TeacherRequest(cache_key("concise", teacher.revision, f"prompt {i}", "img", {}, 0), f"q{i}",
                               f"prompt {i}", None, "count", "2", ("1", "2", "3"), 0) for i in range(4)]
        assert cache.fill(teacher, reqs)["requested"] == 4
    answers = cache.load("concise").groupby("revision")["answer"].apply(set).tolist()
    assert sorted(map(sorted, answers)) != [["2"], ["2"]]   # error rate 1.0 never says the gold "2"
