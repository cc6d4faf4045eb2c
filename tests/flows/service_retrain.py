"""Service mode, for real: a Prefect server, a process worker and an MLflow tracking server on free loopback
ports (`python -m flows.service start`, what `make serve` runs), the deployments of prefect.yaml, and the
retrain deployment triggered through Prefect's REST API on the session's finished tiny project (its champion
is what the pipeline test's flow run registered: no second run from scratch).

Checks: a malformed file in data/incoming/ is rejected to data/rejected/ with its report and nothing trains;
a good file is pooled (DVC), trains from the champion with stages dispatched to the pool's deployments,
registers a `challenger` and moves `champion` only if the evaluation beat it; a retrain triggered while
another runs waits for it (one writer per DVC workspace); `stop` leaves no process behind.
"""
import io
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pandas as pd
import pytest
import yaml

from tests.flows.test_pipeline import project_env


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, method: str, path: str, body: dict | None = None, attempts: int = 6):
    """One call to the Prefect REST API. A busy server (its SQLite database under a loaded machine) answers
    503 now and then; Prefect's own client retries 429/502/503/504, and so does this."""
    for attempt in range(attempts):
        req = urllib.request.Request(base + path, method=method, data=json.dumps(body).encode() if body is not None
                                     else None, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 502, 503, 504) or attempt == attempts - 1:
                raise
        time.sleep(2 * (attempt + 1))


def trigger(base: str, deployment: str, parameters: dict | None = None) -> str:
    dep = api(base, "GET", f"/deployments/name/{deployment}")
    run = api(base, "POST", f"/deployments/{dep['id']}/create_flow_run", {"parameters": parameters or {}})
    return run["id"]


def flow_run(base: str, run_id: str) -> dict:
    return api(base, "GET", f"/flow_runs/{run_id}")


def wait_final(base: str, run_id: str, timeout_s: float, seen: list | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = flow_run(base, run_id)
        if seen is not None:
            seen.append(run["state"]["name"])
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(2)
    raise AssertionError(f"flow run {run_id} not finished after {timeout_s} s: {flow_run(base, run_id)['state']}")


def incoming_table(proj, n: int) -> bytes:
    """n rows of the world's train split as an importable parquet (images embedded as PNG bytes)."""
    from protege.data.rows import load_rows

    rows = [r for r in load_rows(proj / "data/world/train.parquet") if not isinstance(r.image, list)][:n]
    images = []
    for r in rows:
        buf = io.BytesIO()
        r.image.save(buf, format="PNG")
        images.append(buf.getvalue())
    df = pd.DataFrame({"id": [f"new-{i}" for i in range(n)], "question": [r.question for r in rows],
                       "answer": [r.answer for r in rows], "image": images})
    buf = io.BytesIO()
    df.to_parquet(buf)
    return buf.getvalue()


def registry(proj, env):
    """{alias: version} and the versions of protege-student, read through the tracking server."""
    code = ("import json, mlflow; from mlflow import MlflowClient; c = MlflowClient(); "
            "m = c.get_registered_model('protege-student'); "
            "vs = sorted(int(v.version) for v in c.search_model_versions(\"name='protege-student'\")); "
            "print(json.dumps({'aliases': {k: str(v) for k, v in m.aliases.items()}, 'versions': vs}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_retrain_deployment_on_a_local_service(finished_project):
    # the champion: the session's pipeline run, inline, into the project's sqlite store (the server serves it)
    proj, first = finished_project.path, finished_project.flow
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert (proj / "data/pool.dvc").exists()  # the pool is versioned from the first run, empty
    params = yaml.safe_load((proj / "params.yaml").read_text())

    prefect_port, mlflow_port = free_port(), free_port()
    env = project_env(proj)
    t0 = time.monotonic()
    start = subprocess.run([sys.executable, "-m", "flows.service", "start", "--project", str(proj), "--detach",
                            "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port)],
                           cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    started = json.loads((proj / ".service/service.json").read_text()) if start.returncode == 0 else {}
    try:
        assert start.returncode == 0, start.stdout[-3000:] + start.stderr[-3000:]
        assert f"http://127.0.0.1:{prefect_port}" in start.stdout and f"http://127.0.0.1:{mlflow_port}" in start.stdout
        # the worker's stage runs fork from a warm stage host, a service of its own that `stop` ends too
        assert "stage-host" in started["pids"]
        print(f"service up in {time.monotonic() - t0:.0f} s")
        base = f"http://127.0.0.1:{prefect_port}/api"
        client_env = dict(env, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow_port}")
        before = registry(proj, client_env)
        assert before["aliases"].get("champion") == "1" and before["versions"] == [1]
        champion_files = sorted(p.name for p in (proj / "mlartifacts").rglob("*") if p.is_file())

        # 1. a malformed file: rejected with its report, nothing trains, the champion stays
        inbox = proj / "data/incoming"
        inbox.mkdir(parents=True)
        (inbox / "broken.jsonl").write_text('{"id": "a", "image": "missing.png", "conversations": '
                                            '[{"from": "human", "value": "<image>\\nHow many?"}, '
                                            '{"from": "gpt", "value": "3"}]}\nnot json at all\n')
        bad = wait_final(base, trigger(base, "protege-retrain/retrain"), 600)
        assert bad["state"]["type"] == "COMPLETED", bad["state"]
        rejected = list((proj / "data/rejected").rglob("broken.jsonl"))
        assert len(rejected) == 1 and not (inbox / "broken.jsonl").exists()
        report = json.loads(rejected[0].with_name("broken.jsonl.report.json").read_text())
        assert "broken.jsonl" in report["error"] and "line" in report["error"]
        assert registry(proj, client_env) == before
        assert sorted(p.name for p in (proj / "mlartifacts").rglob("*") if p.is_file()) == champion_files

        # 2. a good file, and a second retrain triggered while the first runs
        (inbox / "new.parquet").write_bytes(incoming_table(proj, 12))
        t1 = time.monotonic()
        ids = [trigger(base, "protege-retrain/retrain"), trigger(base, "protege-retrain/retrain")]
        runs = [wait_final(base, i, 1800) for i in ids]
        print(f"two retrains, one with new data: {time.monotonic() - t1:.0f} s")
        assert all(r["state"]["type"] == "COMPLETED" for r in runs), [r["state"] for r in runs]
        assert os.path.exists(started["stage_host_socket"])  # the host was up and listening
        # one writer: whichever the worker took first, the other started only after it had ended
        trained, queued = sorted(runs, key=lambda r: r["start_time"])
        assert queued["start_time"] >= trained["end_time"], (queued["start_time"], trained["end_time"])
        first_id, second_id = trained["id"], queued["id"]

        # the new data went into the DVC-versioned pool; the file is archived with the run id
        record = json.loads((proj / "data/archive" / first_id / "retrain.json").read_text())
        assert len(record["accepted"]) == 1 and (proj / "data/archive" / first_id / "new.parquet").exists()
        assert (proj / "data/pool" / record["accepted"][0] / "train.parquet").exists()
        pool_lock = yaml.safe_load((proj / "data/pool.dvc").read_text())["outs"][0]
        assert pool_lock["nfiles"] > 0
        # it trained from the champion: exported, DVC-tracked, and named by sft.init
        assert record["start"]["champion_version"] == "1" and record["start"]["init"] == "models/champion"
        assert (proj / "models/champion.dvc").exists()
        assert yaml.safe_load((proj / "params.yaml").read_text())["sft"]["init"] == "models/champion"
        lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]["sft"]
        assert any(d["path"] == "models/champion" for d in lock["deps"])
        # stages ran as flow runs of the stage deployments (the pools' path)
        stage_runs = api(base, "POST", "/flow_runs/filter",
                         {"flows": {"name": {"any_": ["protege-stage"]}}, "limit": 100})
        assert {r["name"] for r in stage_runs} >= {"sft", "rl", "evaluate", "promote"}
        # a stage DVC calls up to date is not dispatched: the new data never reaches the game chains
        assert not {r["name"] for r in stage_runs} & {"agent_sft", "agent_rl", "tool_sft", "tool_rl"}

        after = registry(proj, client_env)
        promotion = record["promotion"]
        assert after["versions"] == [1, 2] and after["aliases"].get("challenger") == "2"
        expected_champion = "2" if promotion["promoted"] else "1"
        assert after["aliases"]["champion"] == expected_champion
        assert promotion["promoted"] == (promotion["score"] > promotion["previous_champion_score"]
                                         + params["promote"]["margin"])
        # the queued run found an empty inbox and trained nothing
        later = json.loads((proj / "data/archive" / second_id / "retrain.json").read_text())
        assert later["accepted"] == [] and later["promotion"] is None
    finally:
        stop = subprocess.run([sys.executable, "-m", "flows.service", "stop", "--project", str(proj)], cwd=proj,
                              env=env, capture_output=True, text=True, timeout=120)
        from flows.service import _group_alive

        assert not os.path.exists(os.path.dirname(started.get("stage_host_socket", "/nonexistent/sock")))
        for name, pgid in started.get("pids", {}).items():
            assert not _group_alive(pgid), f"{name} (process group {pgid}) still running after stop: " \
                                           f"{stop.stdout}{stop.stderr}"
