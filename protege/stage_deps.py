"""What each pipeline stage really depends on: the protege source files it can import and the params it
reads, found by reading the code (ast), so a test can hold dvc.yaml to it and `dvc status` never calls
stale outputs up to date.

Code: the stage module (`protege/stages/<name>.py`), what runs every stage (`protege/stages/__init__.py`,
`protege/tracking.py`, `protege/config.py`) and every protege module they import, at any depth, including
imports inside functions. `protege/cli.py` is left out: its `stage` command only parses arguments and
dispatches. Params: every `cfg.<section>.<key>` the stage module reads, and the functions it uses from
other stage modules read (a section used whole, as in `c = cfg.rl`, means all of it). A setting config.py
marks as changing nothing a stage writes (`threads`, `orchestration.jobs`, `rl.offload_idle`, ...) is not a
dependency, inside a section used whole too: such a section is listed by its other settings. A stage that hands
a section on whole but never reads part of it says so in a module-level literal, `NOT_READ = {"agent": ["rl"]}`
(the warm starts leave their game's RL section to the RL stage), and those parts are not its dependencies.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT_NAMES = ("cfg", "config")  # how stage code names the Config it is handed
RUNNER = ("stages/__init__.py", "tracking.py", "config.py")


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != "protege":
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(("protege",) + path.relative_to(PACKAGE).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + (1 if path.name != "__init__.py" else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    return names


def code_files(stage: str) -> set[Path]:
    """Every protege source file the stage can run, relative to the repository root."""
    start = [PACKAGE / "stages" / f"{stage}.py"] + [PACKAGE / rel for rel in RUNNER]
    seen: set[Path] = set()
    todo = [p for p in start if p.is_file()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # a package's __init__ runs on the way to its modules
                found = _module_file(".".join(parts[:i]))
                if found and found not in seen:
                    todo.append(found)
    return {p.relative_to(PACKAGE.parent) for p in seen}


def _reads_in(tree: ast.AST) -> set[str]:
    """'section.key', 'section' (used whole) or 'key' (top level) for every cfg.* read under `tree`."""
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # cfg.rl inside cfg.rl.lr
    reads = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ROOT_NAMES
                and id(node) not in inner):
            reads.add(node.attr)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Name) and node.value.value.id in ROOT_NAMES):
            reads.add(f"{node.value.attr}.{node.attr}")
    return reads


def _stage_tree(module: str) -> ast.Module | None:
    path = PACKAGE / "stages" / f"{module}.py"
    return ast.parse(path.read_text(encoding="utf-8")) if path.is_file() else None


def _stage_imports(tree: ast.Module) -> dict[str, str]:
    """Names imported from other stage modules: name -> module."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("protege.stages."):
            for a in node.names:
                out[a.asname or a.name] = node.module.rsplit(".", 1)[1]
    return out


def _function_reads(module: str, name: str, seen: set) -> set[str]:
    """cfg reads of one function of a stage module and of what it calls there, by name, transitively."""
    if (module, name) in seen:
        return set()
    seen.add((module, name))
    tree = _stage_tree(module)
    if tree is None:
        return set()
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    if name not in defs:
        return set()
    body = defs[name]
    reads = _reads_in(body)
    imported = _stage_imports(tree)
    for node in ast.walk(body):
        if isinstance(node, ast.Name):
            if node.id in defs:
                reads |= _function_reads(module, node.id, seen)
            elif node.id in imported:
                reads |= _function_reads(imported[node.id], node.id, seen)
    return reads


def params_read(stage: str) -> set[str]:
    """The params a stage reads: 'section' where a whole section is handed on, else 'section.key'.

    The stage module is read whole; from other stage modules only the functions it uses (and what they
    call), so importing a helper from `stages/rl.py` does not make a stage depend on all of `rl`."""
    from protege.config import Config, untracked_keys

    tree = _stage_tree(stage)
    reads = _reads_in(tree) if tree is not None else set()
    seen: set = set()
    for name, module in (_stage_imports(tree).items() if tree is not None else []):
        reads |= _function_reads(module, name, seen)
    untracked = untracked_keys(Config)
    reads -= untracked
    fields = Config.model_fields
    out = set()
    for r in reads:
        section, _, key = r.partition(".")
        if section not in fields:
            continue
        ann = fields[section].annotation
        is_section = isinstance(ann, type) and hasattr(ann, "model_fields")
        if not is_section:
            out.add(section)
        elif key and key in ann.model_fields:
            out.add(r)
        else:
            out.add(section)
    # a key read from a section also used whole is covered by the section
    out = {r for r in out if "." not in r or r.split(".")[0] not in out}
    gone = untracked | _not_read(tree)
    return {part for r in out for part in _tracked_parts(r, Config, gone)}


def _not_read(tree: ast.Module | None) -> set[str]:
    """The 'section.key' parts a stage module, or a stage module whose functions it uses, declares it never reads
    (its module-level `NOT_READ = {"section": ["key", ...]}` literal)."""
    modules = [tree] + [_stage_tree(m) for m in set(_stage_imports(tree).values())] if tree is not None else []
    out = set()
    for module in filter(None, modules):
        for node in module.body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NOT_READ"
                                                     for t in node.targets)):
                out |= {f"{section}.{key}" for section, keys in ast.literal_eval(node.value).items() for key in keys}
    return out


def _tracked_parts(name: str, root, gone: set[str]) -> list[str]:
    """`name` ('section' or 'section.key') as DVC params: itself, or, when some setting under it is in `gone`
    (changes nothing the stage writes, or is not read), its other settings, sub-sections split the same way."""
    if not any(g.startswith(name + ".") for g in gone):
        return [name]
    model = root
    for part in name.split("."):
        model = model.model_fields[part].annotation
    out = []
    for key, field in model.model_fields.items():
        dotted = f"{name}.{key}"
        if dotted in gone:
            continue
        sub = field.annotation
        is_section = isinstance(sub, type) and hasattr(sub, "model_fields")
        out += _tracked_parts(dotted, root, gone) if is_section else [dotted]
    return out


def covered(path: str, deps: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def missing_code_deps(stage: str, deps: list[str]) -> list[str]:
    return sorted(str(p) for p in code_files(stage) if not covered(str(p), deps))


def missing_params(stage: str, params: list[str]) -> list[str]:
    declared = [str(p) for p in params]
    return sorted(r for r in params_read(stage)
                  if r not in declared and r.split(".")[0] not in declared)
