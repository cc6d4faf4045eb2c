"""Teacher backends end to end: a local transformers model fills the cache; a SIGKILL mid-fill loses nothing."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from protege.data.rows import image_path, read_table
from protege.models.student import save_student
from protege.teachers.backends import SamplingParams, TeacherRequest, TransformersTeacher
from protege.files import file_sha256
from protege.teachers.cache import TeacherCache, cache_key
from tests.conftest import REPO


def test_transformers_teacher_fills_the_cache(tiny_student, tiny_processor, tiny_world, tmp_path):
    save_student(tiny_student, tiny_processor, tmp_path / "teacher")
    teacher = TransformersTeacher("local", tmp_path / "teacher", SamplingParams(temperature=1.0, max_tokens=5),
                                  batch_size=4)
    table = tiny_world / "rl.parquet"
    rows = read_table(table).head(5).to_dict("records")
    reqs = [TeacherRequest(cache_key("local", teacher.revision, r["question"], file_sha256(image_path(table, r["image"])),
                                     teacher.sampling.as_dict(), k), r["id"], r["question"],
                           str(image_path(table, r["image"])), sample_index=k) for r in rows for k in range(2)]
    stats = TeacherCache(tmp_path / "cache").fill(teacher, reqs)
    assert stats["received"] == 10 and stats["failures"] == 0
    df = TeacherCache(tmp_path / "cache").load("local")
    assert len(df) == 10 and set(df["finish_reason"]) <= {"stop", "length"}
    assert (df["completion_tokens"] <= 5).all() and (df["prompt_tokens"] > 16).all()
    assert df.loc[df["finish_reason"] == "length", "truncated"].all()  # cut-off answers are flagged
    assert len(teacher.revision) == 16


FILL = textwrap.dedent("""
    import sys
    from protege.teachers.backends import SamplingParams, TeacherRequest
    from protege.teachers.cache import TeacherCache, cache_key
    from protege.teachers.openai_backend import OpenAITeacher
    url, root = sys.argv[1], sys.argv[2]
    reqs = [TeacherRequest(cache_key("remote", "m", f"q{i}", "img", {}, 0), f"q{i}", f"question {i}")
            for i in range(200)]
    teacher = OpenAITeacher("remote", url, "m", SamplingParams(), api_key_env=None, concurrency=8)
    print(TeacherCache(root, flush_every=8).fill(teacher, reqs)["requested"], flush=True)
""")


def test_sigkill_mid_fill_then_rerun_gives_one_answer_per_key(tmp_path):
    port_file = tmp_path / "port"
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import socket, subprocess, sys
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        open({str(port_file)!r}, "w").write(str(port))
        from protege.loopback_server import main
        sys.argv = ["x", "--port", str(port), "--latency", "0.05"]
        main()
    """)])
    try:
        for _ in range(100):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port_file.read_text()}/v1"
        time.sleep(1.0)
        root = tmp_path / "cache"
        child = subprocess.Popen([sys.executable, "-c", FILL, url, str(root)], cwd=REPO)
        folder = root / "remote"
        deadline = time.time() + 60
        while time.time() < deadline and len(list(folder.glob("shard-*.parquet"))) < 4:
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        stored = len(TeacherCache(root).load("remote"))
        assert 0 < stored < 200, stored  # killed halfway
        rerun = subprocess.run([sys.executable, "-c", FILL, url, str(root)], cwd=REPO, capture_output=True, text=True,
                               check=True)
        assert int(rerun.stdout.strip()) == 200 - stored  # only the missing keys are asked
        df = TeacherCache(root).load("remote")
        assert len(df) == 200 and df["key"].is_unique
        shards = [__import__("pandas").read_parquet(p) for p in folder.glob("shard-*.parquet")]
        assert sum(len(s) for s in shards) == 200  # no duplicate stored anywhere
    finally:
        server.terminate()
        server.wait(10)


def test_a_question_about_two_images_reaches_teachers_with_both(tiny_student, tiny_processor, tiny_world, tmp_path):
    import json

    from protege.teachers.openai_backend import OpenAITeacher

    table = tiny_world / "rl.parquet"
    rec = next(r for r in read_table(table).to_dict("records") if json.loads(r["extra_images"]))
    paths = [str(image_path(table, rel)) for rel in [rec["image"], *json.loads(rec["extra_images"])]]
    req = TeacherRequest("k" * 64, rec["id"], rec["question"], paths[0], extra_image_paths=tuple(paths[1:]))
    assert req.image_paths == paths and len(paths) == 2
    api = OpenAITeacher("remote", "http://127.0.0.1:9/v1", "m", SamplingParams(), api_key_env=None)
    parts = api._payload(req)["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert parts[0]["image_url"]["url"] != parts[1]["image_url"]["url"]
    save_student(tiny_student, tiny_processor, tmp_path / "teacher")
    local = TransformersTeacher("local", tmp_path / "teacher", SamplingParams(temperature=1.0, max_tokens=3))
    got = []
    local.run([req], got.append)
    assert len(got) == 1 and got[0].prompt_tokens > 32  # both images' 16 tokens each are in the prompt
