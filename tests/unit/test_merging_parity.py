"""protege merge == mergekit on every case of benchmarks/mergekit_parity.py, when mergekit is here: each method,
slices (slerp with filtered gradients, TIES over two slices), a passthrough frankenmerge, and DARE at density 0.5
(the same masks at the same seed).

Opt-in: PROTEGE_MERGEKIT=/path/to/mergekit-yaml (mergekit in its own venv; about 15 s per case)."""
import importlib.util
import os
from pathlib import Path

import pytest

MERGEKIT = os.environ.get("PROTEGE_MERGEKIT")
pytestmark = pytest.mark.skipif(not MERGEKIT, reason="set PROTEGE_MERGEKIT to a mergekit-yaml to compare with it")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mergekit_parity.py"
CASES = ["linear", "task_arithmetic", "ties", "ties_unnormalized", "ties_bf16_in_float32", "dare_linear_d1",
         "dare_ties_d1", "dare_linear_d0.5", "dare_ties_d0.5", "breadcrumbs", "breadcrumbs_ties", "slerp",
         "model_stock", "model_stock_filter_wise", "slices_slerp", "slices_ties", "slices_dare_ties_d0.5",
         "passthrough_frankenmerge"]


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("mergekit_parity", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    root = tmp_path_factory.mktemp("parity")
    return mod, root, mod.configs(mod.build_checkpoints(root / "ckpts"))


@pytest.mark.parametrize("case", CASES)
def test_same_tensors_as_mergekit(parity, case):
    mod, root, cases = parity
    res = mod.run_case(case, cases[case], root / "runs", MERGEKIT)
    assert "error" not in res, res.get("error")
    assert not res["only_protege"] and not res["only_mergekit"]
    assert res["max_abs_diff"] <= 1e-5, f"{case}: {res['worst']} differs by {res['max_abs_diff']}"
    assert res["num_hidden_layers"]["protege"] == res["num_hidden_layers"]["mergekit"]
