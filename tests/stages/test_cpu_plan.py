"""`protege plan --device cpu` predicts a CPU run's peak resident memory: one SFT step (every weight trains)
and one RL step (attention trains, a KL reference beside the policy, sampling with a KV cache) of a mid-size
student (hidden 1024, vocabulary 152,064), each in a fresh process (ru_maxrss is per process), within 20%."""
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("stage", ["sft", "rl"])
def test_the_cpu_plan_is_within_a_fifth_of_the_measured_peak(stage):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cpu_plan.py"), "--stage", stage,
                          "--threads", "1"], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["vocab"] == 152_064 and r["hidden"] >= 1024
    assert r["plan_parts_mib"]["runtime"] > 0 and r["plan_parts_mib"]["activations"] > 0
    if stage == "rl":
        assert r["plan_parts_mib"]["reference"] == r["plan_parts_mib"]["weights"]  # a full copy, resident
    assert 0.8 <= r["ratio"] <= 1.2, r
