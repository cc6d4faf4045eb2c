"""A name used but never defined is a NameError the first time that line runs, which may be a user's command
that no other test reaches. pyflakes finds them without running anything."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_undefined_names_in_shipped_code():
    proc = subprocess.run([sys.executable, "-m", "pyflakes", "protege", "flows", "tasks", "benchmarks"],
                          cwd=REPO, capture_output=True, text=True)
    assert "No module named pyflakes" not in proc.stderr, "pyflakes is a test dependency: `make install` installs it"
    undefined = [line for line in proc.stdout.splitlines() if "undefined name" in line]
    assert not undefined, "\n".join(undefined)
