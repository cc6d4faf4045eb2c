"""Rewrites dvc.yaml for params.yaml from the stage table in protege/dag.py: each stage's code deps and
params come from what it really imports and reads (protege/stage_deps.py). Run after adding an import to a
stage; tests/unit/test_dvc_deps.py fails until dvc.yaml is current. The same as `protege dag`.

    python dev/sync_dvc_deps.py          # rewrite dvc.yaml in place
"""
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root))
from protege import dag  # noqa: E402
from protege.config import load_config  # noqa: E402

changed = dag.write(load_config(root / "params.yaml"), root)
print(f"{'rewrote' if changed else 'current:'} {root / 'dvc.yaml'}")
