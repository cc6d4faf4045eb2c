"""`protege eval run` with a tiny student on mini benchmark files, then `protege eval compare` of the two
MLflow runs; batched answers equal one-at-a-time answers."""
import json
import re

import yaml
from typer.testing import CliRunner

from protege.cli import app
from protege.config import ModelConfig
from protege.eval.writers import write_benchmark
from protege.world.benchmarks import FORMATS, SUFFIX, make_mini_benchmark

CHOSEN = ("ai2d", "mmbench", "blink", "mmvet", "mathvista")


def project(tmp_path, tiny_processor):
    from protege.models.student import build_student, save_student

    files, avoid = {}, set()
    for name in CHOSEN:
        items = make_mini_benchmark(name, 11, 64, 8, avoid)
        files[name] = str(write_benchmark(name, items, tmp_path / "bench" / name / f"{name}{SUFFIX[FORMATS[name]]}",
                                          FORMATS[name]))
    for seed in (0, 1):
        save_student(build_student(ModelConfig(), tiny_processor, seed=seed), tiny_processor,
                     tmp_path / f"student{seed}")
    params = {"evaluate": {"benchmarks": files, "bootstrap": 200, "max_new_tokens": 4, "batch_size": 16}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def test_eval_run_then_compare(tmp_path, tiny_processor, monkeypatch):
    proj = project(tmp_path, tiny_processor)
    monkeypatch.chdir(proj)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PROTEGE_PARENT_RUN_ID", raising=False)
    runner, run_ids = CliRunner(), []
    for seed in (0, 1):
        res = runner.invoke(app, ["eval", "run", "--model", f"student{seed}", "--out", "out", "--name", f"s{seed}"])
        assert res.exit_code == 0, res.output
        run_ids.append(re.search(r"MLflow run (\w+)", res.output).group(1))
        report = json.loads((proj / "out/report.json").read_text())
        model = report["models"][f"s{seed}"]
        assert set(model["benchmarks"]) == set(CHOSEN)
        assert model["mean_tokens"] > 0 and model["mean_latency_s"] > 0
        preds = [json.loads(line) for line in (proj / f"out/s{seed}/blink/predictions.jsonl").read_text().splitlines()]
        assert len(preds) == 8 and all(p["tokens"] >= 1 and p["latency_s"] > 0 for p in preds)
    assert (proj / "out/report.png").stat().st_size > 1000

    res = runner.invoke(app, ["eval", "compare", run_ids[0], run_ids[1], "--bootstrap", "200"])
    assert res.exit_code == 0, res.output
    assert "| ai2d |" in res.output and "**average** (5)" in res.output

    res = runner.invoke(app, ["eval", "compare", run_ids[0], "no-such-run"])
    assert res.exit_code == 1 and "no-such-run" in res.output


def test_batched_answers_equal_one_at_a_time(tiny_processor):
    from protege.eval.runner import generate_predictions
    from protege.models.student import build_student

    model = build_student(ModelConfig(), tiny_processor, seed=3)
    items = [it for name in ("ai2d", "blink", "realworldqa") for it in make_mini_benchmark(name, 5, 64, 6, set())]
    batched = generate_predictions(model, tiny_processor, items, batch_size=18, max_new_tokens=5)
    single = generate_predictions(model, tiny_processor, items, batch_size=1, max_new_tokens=5)
    assert [p.index for p in batched] == [it.index for it in items]
    assert [p.text for p in batched] == [p.text for p in single]
