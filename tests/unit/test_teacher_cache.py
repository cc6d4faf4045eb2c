from protege.teachers.backends import ScriptedTeacher, TeacherRequest
from protege.teachers.cache import TeacherCache, cache_key


class Counting(ScriptedTeacher):
    calls = 0

    def answer(self, requests):
        Counting.calls += len(requests)
        return super().answer(requests)


def requests(n):
    return [TeacherRequest(cache_key("concise", "v1", f"prompt {i}", "img", {"t": 1.0}, k), f"q{i}", "count",
                           f"prompt {i}", "2", ("1", "2", "3"), k) for i in range(n) for k in range(2)]


def test_key_depends_on_every_part():
    base = cache_key("t", "r", "p", "h", {"t": 1}, 0)
    assert len({base, cache_key("u", "r", "p", "h", {"t": 1}, 0), cache_key("t", "s", "p", "h", {"t": 1}, 0),
                cache_key("t", "r", "q", "h", {"t": 1}, 0), cache_key("t", "r", "p", "i", {"t": 1}, 0),
                cache_key("t", "r", "p", "h", {"t": 2}, 0), cache_key("t", "r", "p", "h", {"t": 1}, 1)}) == 7


def test_refill_asks_nothing_and_extends_only_missing(tmp_path):
    cache = TeacherCache(tmp_path)
    teacher = Counting("concise", error_rate=0.0, seed=0)
    assert cache.fill(teacher, requests(3))["requested"] == 6
    assert cache.fill(teacher, requests(3))["requested"] == 0
    assert Counting.calls == 6
    assert cache.fill(teacher, requests(5))["requested"] == 4
    df = cache.load("concise")
    assert len(df) == 10 and df["key"].is_unique
