"""The sandbox for model-written code (protege/tools/sandbox.py): limits, outcomes, plain executions, unsafe
mode and the CLI. Hostile programs are in test_sandbox_hostile.py."""
import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from protege.cli import app
from protege.tools import sandbox as sb
from protege.tools.sandbox import Limits, Outcome, Sandbox, SandboxUnavailable, isolation_tool

SMALL = Limits(timeout_s=2, cpu_s=2, memory_mb=256, nproc=8, output_bytes=1000)


def outcome(**kw) -> Outcome:
    base = dict(stdout="", stderr="", exit_code=0, limit=None, ms=12.0, isolation="bubblewrap")
    return Outcome(**{**base, **kw})


@pytest.fixture(scope="module")
def box() -> Sandbox:
    if isolation_tool() is None:
        pytest.skip("bubblewrap (bwrap) is not installed or cannot run here: apt-get install bubblewrap")
    return Sandbox(SMALL)


@pytest.fixture(scope="module")
def unsafe_box() -> Sandbox:
    return Sandbox(SMALL, unsafe=True)


# --- Limits -------------------------------------------------------------------------------------------------

def test_default_limits_are_valid():
    lim = Limits()
    assert (lim.timeout_s, lim.cpu_s, lim.memory_mb, lim.nproc, lim.output_bytes, lim.file_mb, lim.disk_mb) == (
        5.0, 5, 512, 16, 4096, 16, 64)


@pytest.mark.parametrize("field, value", [
    ("timeout_s", 0), ("timeout_s", -1.0), ("timeout_s", float("nan")), ("timeout_s", float("inf")),
    ("timeout_s", 3601), ("timeout_s", "5"), ("timeout_s", True),
    ("cpu_s", 0), ("cpu_s", 1.5), ("cpu_s", 3601), ("memory_mb", 16), ("memory_mb", 2_000_000),
    ("nproc", 0), ("nproc", True), ("output_bytes", 0), ("file_mb", -1), ("file_mb", "16"),
    ("disk_mb", 0), ("disk_mb", 1.5),
])
def test_bad_limits_name_the_field_and_range(field, value):
    with pytest.raises(ValueError, match=rf"Limits\.{field} must be ") as info:
        Limits(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_limits_are_frozen():
    with pytest.raises(Exception):
        Limits().nproc = 100


# --- Outcome ------------------------------------------------------------------------------------------------

def test_ok_outcome_shows_stdout():
    o = outcome(stdout="42\n")
    assert o.ok and not o.error and o.tool_text() == "42\n"


def test_truncated_output_alone_stays_ok_and_says_so():
    o = outcome(stdout="x" * 50, limit="output")
    assert o.ok and o.tool_text().endswith("[output truncated]")


@pytest.mark.parametrize("kw, text", [
    (dict(exit_code=None, limit="timeout", ms=5003.0), "Error: timeout after 5.0 s"),
    (dict(exit_code=-24, limit="cpu"), "Error: CPU time limit exceeded"),
    (dict(exit_code=1, limit="memory", stderr="Traceback ...\nMemoryError\n"), "Error: memory limit exceeded"),
    (dict(exit_code=1, limit="nproc"), "Error: process limit exceeded (too many processes or threads)"),
    (dict(exit_code=-9, limit="output", stdout="A" * 10), "Error: output limit exceeded (program killed)"),
    (dict(exit_code=1, stderr="Traceback (most recent call last):\n  File \"main.py\", line 1\n"
                               "ZeroDivisionError: division by zero\n\n"),
     "Error: ZeroDivisionError: division by zero"),
    (dict(exit_code=-11), "Error: killed by signal SIGSEGV"),
    (dict(exit_code=3), "Error: exit status 3"),
])
def test_error_tool_text(kw, text):
    o = outcome(**kw)
    assert o.error and not o.ok and o.tool_text() == text


def test_limit_hit_with_exit_zero_is_an_error():
    assert outcome(limit="nproc").error and outcome(limit="memory").error


@pytest.mark.parametrize("max_chars", [1, 2, 10, 399, 400])
def test_tool_text_never_longer_than_max_chars(max_chars):
    for o in (outcome(stdout="y" * 1000), outcome(exit_code=1, stderr="E" * 1000),
              outcome(stdout="z" * 1000, limit="output"), outcome(exit_code=None, limit="timeout", ms=1e9)):
        assert len(o.tool_text(max_chars)) <= max_chars


def test_tool_text_rejects_bad_max_chars():
    with pytest.raises(ValueError):
        outcome().tool_text(0)


def test_to_json_fields():
    o = outcome(stdout="a", stderr="b", exit_code=2, limit=None, ms=1.23456)
    assert o.to_json() == {"stdout": "a", "stderr": "b", "exit_code": 2, "limit": None, "ms": 1.235,
                           "isolation": "bubblewrap"}
    json.dumps(o.to_json())


# --- executions under bubblewrap ----------------------------------------------------------------------------

def test_trivial_program(box):
    o = box.run("print(6 * 7)")
    assert o.ok and o.stdout == "42\n" and o.isolation == "bubblewrap" and o.limit is None and 0 < o.ms < 2000
    assert box.process_cap in ("cgroup", "rlimit")


def test_stdlib_math_imports(box):
    o = box.run("import fractions, numbers, math, decimal, statistics, itertools, json, re\n"
                "print(fractions.Fraction(1, 3) + fractions.Fraction(1, 6), math.comb(10, 3))")
    assert o.ok and o.stdout == "1/2 120\n"


def test_syntax_error(box):
    o = box.run("def f(:\n    pass\n")
    assert o.error and o.exit_code == 1 and o.tool_text() == "Error: SyntaxError: invalid syntax"


def test_exception_message(box):
    o = box.run("print('before')\nx = 1 / 0\n")
    assert o.error and o.stdout == "before\n" and o.tool_text() == "Error: ZeroDivisionError: division by zero"


def test_exit_codes(box):
    assert box.run("import sys; sys.exit(3)").exit_code == 3
    o = box.run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert o.exit_code == -11 and o.tool_text() == "Error: killed by signal SIGSEGV"


def test_clean_environment(box, monkeypatch):
    monkeypatch.setenv("PROTEGE_SECRET_TOKEN", "hunter2-do-not-leak")
    o = box.run("import os, json; print(json.dumps(dict(os.environ)))")
    env = json.loads(o.stdout)
    assert "hunter2" not in o.stdout and "PROTEGE_SECRET_TOKEN" not in env
    assert env["HOME"] == "/sandbox" and env["LANG"] == "C.UTF-8" and env["PYTHONHASHSEED"] == "0"
    assert set(env) <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "MALLOC_ARENA_MAX",
                        "PWD"}


def test_hash_seed_is_fixed(box):
    code = "print(hash('protege'))"
    assert box.run(code).stdout == box.run(code).stdout


def test_cwd_is_a_fresh_writable_temp_dir(box, monkeypatch):
    made = []
    real = sb.tempfile.mkdtemp

    def spy(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]

    monkeypatch.setattr(sb.tempfile, "mkdtemp", spy)
    first = box.run("import os; open('note.txt', 'w').write('hi'); print(os.getcwd(), sorted(os.listdir('.')))")
    second = box.run("import os; print(sorted(os.listdir('.')))")
    assert first.ok and first.stdout == "/sandbox ['main.py', 'note.txt']\n"
    assert second.stdout == "['main.py']\n"
    assert len(made) == 2 and not any(os.path.exists(p) for p in made)


def test_timeout(box):
    o = box.run("import time\nprint('started', flush=True)\nwhile True: time.sleep(0.01)")
    assert o.limit == "timeout" and o.exit_code is None and o.error
    assert 1900 <= o.ms < 4000 and o.stdout == "started\n" and o.tool_text().startswith("Error: timeout after 2.")


def test_output_truncated_but_ok(box):
    o = box.run("print('x' * 5000)")
    assert o.limit == "output" and o.ok and o.stdout == "x" * 1000
    assert o.tool_text(100).endswith("…") and len(o.tool_text(100)) == 100


def test_stderr_keeps_its_end(box):
    o = box.run("import sys\nsys.stderr.write('w' * 5000 + '\\n')\nraise KeyError('the real error')")
    assert o.limit == "output" and o.error and len(o.stderr.encode()) <= 1000
    assert o.tool_text() == "Error: KeyError: 'the real error'"


def test_concurrent_runs(box):
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: box.run(f"import time; time.sleep(0.05); print({i} * {i})"), range(12)))
    assert [o.stdout for o in outs] == [f"{i * i}\n" for i in range(12)] and all(o.ok for o in outs)


def test_run_file(box, tmp_path):
    path = tmp_path / "prog.py"
    path.write_text("import sys\nprint(sys.argv[0].endswith('main.py'), __name__)\n")
    o = box.run_file(path)
    assert o.ok and o.stdout == "True __main__\n"
    with pytest.raises(FileNotFoundError):
        box.run_file(tmp_path / "missing.py")


def test_run_rejects_non_text(box):
    with pytest.raises(TypeError):
        box.run(b"print(1)")


# --- unsafe mode and availability ---------------------------------------------------------------------------

def test_unsafe_mode_runs_with_limits_and_clean_env(unsafe_box, monkeypatch):
    monkeypatch.setenv("PROTEGE_SECRET_TOKEN", "hunter2-do-not-leak")
    o = unsafe_box.run("import os; print(os.getcwd() == os.environ['HOME'], 'PROTEGE_SECRET_TOKEN' in os.environ)")
    assert o.ok and o.isolation == "unsafe" and o.stdout == "True False\n"
    slow = unsafe_box.run("import time\nwhile True: time.sleep(0.01)")
    assert slow.limit == "timeout" and slow.isolation == "unsafe" and slow.ms < 4000
    assert unsafe_box.run("1/0").tool_text() == "Error: ZeroDivisionError: division by zero"


def test_unavailable_without_bubblewrap(monkeypatch):
    monkeypatch.setattr(sb, "isolation_tool", lambda: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox()
    assert Sandbox(SMALL, unsafe=True).run("print(1)").ok


def test_isolation_tool_follows_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert isolation_tool() is None


def test_sandbox_rejects_bad_limits():
    with pytest.raises(TypeError):
        Sandbox({"timeout_s": 1}, unsafe=True)


# --- CLI ----------------------------------------------------------------------------------------------------

def test_cli_runs_a_file_and_prints_json(box, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("print('hi')\nraise ValueError('bad')\n")
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog), "--timeout-s", "2", "--memory-mb", "256"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert set(got) == {"stdout", "stderr", "exit_code", "limit", "ms", "isolation"}
    assert got["stdout"] == "hi\n" and got["exit_code"] == 1 and got["isolation"] == "bubblewrap"


def test_cli_disk_and_file_limits(box, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("open('a', 'wb').write(b'x' * (3 << 20))\nopen('b', 'wb').write(b'x' * (3 << 20))\n")
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog), "--disk-mb", "4"])
    assert res.exit_code == 0 and "No space left on device" in json.loads(res.stdout)["stderr"]
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog), "--file-mb", "2"])
    assert res.exit_code == 0 and "File too large" in json.loads(res.stdout)["stderr"]
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog)])
    assert res.exit_code == 0 and json.loads(res.stdout)["exit_code"] == 0
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog), "--disk-mb", "0"])
    assert res.exit_code == 2 and "Limits.disk_mb must be an integer in [1, 1000000], got 0" in res.output


def test_cli_missing_file(tmp_path):
    res = CliRunner().invoke(app, ["sandbox", "run", str(tmp_path / "nope.py")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_cli_without_bubblewrap(monkeypatch, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("print(1)\n")
    monkeypatch.setattr(sb, "isolation_tool", lambda: None)
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog)])
    assert res.exit_code == 2 and "apt-get install bubblewrap" in res.output
    res = CliRunner().invoke(app, ["sandbox", "run", str(prog), "--unsafe"])
    assert res.exit_code == 0 and json.loads(res.stdout)["isolation"] == "unsafe"


def test_params_sandbox_section_maps_onto_limits():
    """tool.sandbox's fields are Limits' fields (the trainer passes them by name), with the same defaults."""
    from protege.config import SandboxConfig

    assert Limits(**SandboxConfig().model_dump(exclude={"unsafe"})) == Limits()
