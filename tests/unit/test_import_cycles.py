"""No import circle between modules, not only between packages (tests/unit/test_layers.py checks the
first-level units): every module under protege/, flows/ and tasks/ is parsed with `ast` and each import becomes
an edge to the module it names; a strongly connected component of more than one module is a circle.

What counts as an edge:
- every import statement, at module level *and* inside functions or methods (lazy imports). A function-level
  import back into a module that imports you is still a circle in the module structure; it only hides it from
  the interpreter. The repo's lazy imports of optional heavy dependencies (vllm, deepspeed,
  great_expectations, ...) are third-party and never name one of our modules, so they never form an edge.
- `import a.b.c` -> `a.b.c`; `from a.b import c` -> `a.b.c` when that is a module, else `a.b` (its
  `__init__`); relative imports (`from . import x`, `from ..y import z`) are resolved against the importing
  module's package the same way.
- the implicit import of a parent package (`import a.b.c` runs `a/__init__` and `a/b/__init__`) is not an
  edge: only what a statement names is. Otherwise a package whose `__init__` re-exports its submodules would
  form a circle with every one of them that imports a sibling.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

ROOTS = ("protege", "flows", "tasks")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """module name -> file, for every module of the packages in ROOTS that exist in this checkout."""
    found = {}
    for root in ROOTS:
        if (REPO / root / "__init__.py").is_file():
            found.update({module_name(p): p for p in (REPO / root).rglob("*.py")})
    return found


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute module a relative `from` names: level 1 is the importer's own package."""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join(base + ([module] if module else []))


def imports_of(module: str, path: Path, known: set[str], source: str | None = None) -> set[str]:
    """The modules among `known` that `module` imports anywhere in its file (function-level imports too)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                    else node.module or "")
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    out.add(f"{base}.{alias.name}")
                elif base in known:
                    out.add(base)
    out.discard(module)
    return out


def import_graph(files: dict[str, Path] | None = None,
                 sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the modules of ours it imports."""
    files = modules() if files is None else files
    sources = sources or {}
    known = set(files)
    return {mod: imports_of(mod, path, known, sources.get(mod)) for mod, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return sorted(found)


def describe(graph: dict[str, set[str]], comp: list[str]) -> str:
    members = set(comp)
    edges = sorted(f"{a} -> {b}" for a in comp for b in graph.get(a, ()) if b in members)
    return f"{' <-> '.join(comp)}:\n    " + "\n    ".join(edges)


def test_no_import_circle_between_modules():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(describe(graph, c) for c in found)


def test_the_graph_sees_every_package():
    graph = import_graph()
    assert "protege.study.report" in graph and "protege.teachers.cache" in graph
    assert any(m.startswith("flows.") for m in graph) and any(m.startswith("tasks.") for m in graph)


def test_the_rule_catches_a_lazy_import_back_inside_a_package():
    """protege.study.runner imports protege.study.spec; a function-level import of the runner inside spec
    closes a circle that the unit-level check in test_layers.py cannot see (both are in `study`)."""
    files = modules()
    graph = import_graph()
    assert "protege.study.spec" in graph["protege.study.runner"]
    injected = files["protege.study.spec"].read_text() + \
        "\n\ndef _x():\n    from protege.study.runner import plan  # injected\n"
    found = circles(import_graph(files, {"protege.study.spec": injected}))
    assert any({"protege.study.runner", "protege.study.spec"} <= set(c) for c in found)


def test_edges_resolve_from_imports_relative_imports_and_packages(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.sub": pkg / "sub" / "__init__.py",
             "pkg.sub.b": pkg / "sub" / "b.py", "pkg.sub.c": pkg / "sub" / "c.py"}
    sources = {
        "pkg": "",
        "pkg.a": "from pkg.sub import b, NAME\nimport os\n",            # a module and a name of pkg.sub
        "pkg.sub": "NAME = 1\n",
        "pkg.sub.b": "from . import c\nfrom ..a import thing\n",       # relative: pkg.sub.c and pkg.a
        "pkg.sub.c": "def f():\n    import pkg.sub.b\n",               # lazy import
    }
    for mod, path in files.items():
        path.write_text(sources[mod])
    graph = import_graph(files)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b", "pkg.sub"}, "pkg.sub": set(),
                     "pkg.sub.b": {"pkg.sub.c", "pkg.a"}, "pkg.sub.c": {"pkg.sub.b"}}
    assert circles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    assert circles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
