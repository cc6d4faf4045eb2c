"""Imports point one way: foundation <- models / data / world <- rollout and runtime <- algorithms <- stages <-
study / CLI (<- flows and tasks, outside the package). A module may import its own layer or lower ones; the
test parses every module's imports (lazy ones inside functions too). Within a layer, the first-level units
(`protege.rl`, `protege.train`, `protege.cli`, ...) import one another without a circle."""
import ast
from pathlib import Path

from tests.conftest import REPO

# longest matching prefix wins
LAYERS = {
    "foundation": ["protege", "protege.config", "protege.paths", "protege.files", "protege.errors",
                   "protege.stage_names", "protege.workspace", "protege.bench", "protege.provenance",
                   "protege.dvc_lockfile", "protege.config_doc"],
    "models/data/world": ["protege.models", "protege.data", "protege.world", "protege.tools", "protege.merging",
                          "protege.rewards.judge", "protege.rewards.similarity", "protege.tracking"],
    "rollout/runtime": ["protege.generation", "protege.runtime", "protege.rollout", "protege.teachers",
                        "protege.rewards", "protege.loopback_server"],
    "algorithms": ["protege.rl", "protege.train", "protege.eval"],
    "stages": ["protege.stages", "protege.pipeline", "protege.lineage", "protege.pool", "protege.retrain",
               "protege.registry_eval", "protege.stage_deps", "protege.dag", "protege.plan"],
    "study/cli": ["protege.study", "protege.cli", "protege.stage_client", "protege.stage_host", "protege.__main__"],
}
ORDER = list(LAYERS)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    best, found = -1, None
    for name, prefixes in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), name
    assert found is not None, f"{module}: in no layer of tests/unit/test_layers.py"
    return found


def imported(path: Path, modules: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("protege"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("protege"))
    return out


def violations() -> list[str]:
    files = {module_name(p): p for p in (REPO / "protege").rglob("*.py")}
    found = []
    for mod, path in sorted(files.items()):
        mine = ORDER.index(layer(mod))
        for dep in sorted(imported(path, set(files))):
            if dep != "protege" and ORDER.index(layer(dep)) > mine:
                found.append(f"{mod} ({layer(mod)}) imports {dep} ({layer(dep)})")
    return found


def test_imports_point_one_way():
    assert violations() == []


def test_config_imports_nothing_from_eval_or_stages():
    deps = imported(REPO / "protege/config.py", set())
    assert not [d for d in deps if d.startswith(("protege.eval", "protege.stages"))], deps


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """A foundation module importing a stage is reported."""
    fake = REPO / "protege" / "paths.py"
    text = fake.read_text() + "\nfrom protege.stages.rl import run  # injected\n"
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == fake else real(self, *a, **k))
    assert "protege.paths (foundation) imports protege.stages.rl (stages)" in violations()


# --- no import circle between first-level units -----------------------------------------------------

def unit(module: str) -> str:
    """protege.rl.loop -> rl; protege.cli -> cli; protege -> protege (the package root, below everything)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "protege"


def unit_graph(files: dict[str, Path] | None = None) -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the 'module -> module' imports behind the edge (function-level ones too)."""
    files = files or {module_name(p): p for p in (REPO / "protege").rglob("*.py")}
    graph: dict[str, dict[str, set[str]]] = {}
    for mod, path in files.items():
        for dep in imported(path, set(files)):
            a, b = unit(mod), unit(dep)
            if a != b and "protege" not in (a, b):
                graph.setdefault(a, {}).setdefault(b, set()).add(f"{mod} -> {dep}")
    return graph


def circles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_first_level_units():
    graph = unit_graph()
    found = circles(graph)
    detail = [f"{' <-> '.join(c)}: " + "; ".join(sorted(x for a in c for b in c if b in graph.get(a, {})
                                                         for x in graph[a][b])) for c in found]
    assert not found, "\n".join(detail)


def test_the_circle_rule_catches_a_lazy_import_back(monkeypatch):
    """rl imports runtime; a function-level import of rl inside runtime closes a circle."""
    fake = REPO / "protege" / "runtime" / "schedule.py"
    text = fake.read_text() + "\n\ndef _x():\n    from protege.rl.losses import kl_k3  # injected\n"
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if self == fake else real(self, *a, **k))
    assert any({"rl", "runtime"} <= set(c) for c in circles(unit_graph()))
    assert circles({"a": {"b": set()}, "b": {"c": set()}, "c": {"a": set()}}) == [["a", "b", "c"]]
