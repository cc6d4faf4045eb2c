"""Lineage of a registered model: from its checkpoint through dvc.lock back to the data no stage derives.

Recording (promote): the stage that wrote the candidate checkpoint is found in dvc.lock (the out equal to or
above the checkpoint's path), then every stage whose outputs it read, recursively. Each stage's MLflow run is
the one tagged with that output's hash when the stage returned (tracking.OUT_TAG). The whole chain goes into
lineage.json on the promote run; the version's tags hold the short facts (git commit, dvc.lock and params.yaml
sha256, teacher-cache index sha256, the hash of every dataset, the runs of the checkpoint and its parents) and
name that file.

Reading (`protege lineage`): the recorded chain is printed with the hash each path has now in the working
tree, computed by DVC's own hashing; every difference is a warning. Code dependencies (.py files and Python
packages) are checked like data but listed compactly. Sources are the data the chain starts from: inputs no
stage writes, and the outputs of stages that read only code and params (a generator, like `world`).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from protege import tracking
from protege.dvc_lockfile import parse_dvc_file, read_dvc_lock
from protege.errors import UserFacingError
from protege.paths import TEACHER_CACHE

SCHEMA = 1
TAG = "protege.lineage."
ARTIFACT_DIR = "lineage"
RECORD_FILE = "lineage.json"
PARAMS_FILE = "params.yaml"
CODE_SUFFIXES = (".py", ".pyi", ".pyx", ".sh", ".ipynb")
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".ckpt", ".gguf")


# --- reading dvc.lock ----------------------------------------------------------------------------------------

def read_lock(root: Path) -> dict[str, dict]:
    """The stages of ROOT/dvc.lock; a one-line error when it is missing or has none."""
    path = Path(root) / "dvc.lock"
    text = read_dvc_lock(root)
    if text is None:
        raise UserFacingError(f"{path} not found: lineage follows the DVC pipeline's lock (run `dvc repro` or "
                              "`protege pipeline` first, or pass --project)")
    try:
        stages = (parse_dvc_file(text) or {}).get("stages")
    except yaml.YAMLError as exc:
        raise UserFacingError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(stages, dict) or not stages:
        raise UserFacingError(f"{path}: no 'stages' recorded")
    return stages


def entry_hash(entry: dict) -> tuple[str | None, str]:
    """(hash, hash kind) of a dvc.lock dep or out: `md5` for local files and folders since DVC 3."""
    kind = entry.get("hash", "md5")
    return entry.get(kind) or entry.get("md5") or entry.get("etag") or entry.get("checksum"), kind


def producers(stages: dict[str, dict], path: str) -> list[str]:
    """Stages whose outputs are `path`, contain it (a file inside an output folder) or lie inside it."""
    found = []
    for name, entry in stages.items():
        for out in entry.get("outs", []):
            o = out["path"]
            if o == path or path.startswith(o + "/") or o.startswith(path + "/"):
                found.append(name)
                break
    return found


def walk(stages: dict[str, dict], path: str) -> list[str]:
    """The stage that wrote `path`, then every stage upstream of it, nearest first (breadth first)."""
    order: list[str] = []
    queue = producers(stages, path)
    while queue:
        stage = queue.pop(0)
        if stage in order:
            continue
        order.append(stage)
        for dep in stages[stage].get("deps", []):
            queue += [s for s in producers(stages, dep["path"]) if s != stage and s not in order]
    return order


def _is_code(root: Path, path: str) -> bool:
    p = Path(path)
    return p.suffix in CODE_SUFFIXES or (len(p.parts) > 1 and (root / p.parts[0] / "__init__.py").is_file())


def _is_checkpoint(root: Path, path: str) -> bool:
    full = root / path
    if full.is_file():
        return full.suffix in WEIGHT_SUFFIXES
    return full.is_dir() and any(f.suffix in WEIGHT_SUFFIXES for f in full.rglob("*"))


def _local(path: str) -> bool:
    return "://" not in path and not Path(path).is_absolute()


# --- recording (promote) -------------------------------------------------------------------------------------

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def teacher_index_sha256(root: Path) -> str:
    """One digest over every teacher's index.json (each names its shards' sha256), 'absent' without a cache."""
    indexes = sorted((Path(root) / TEACHER_CACHE).glob("*/index.json"))
    if not indexes:
        return "absent"
    h = hashlib.sha256()
    for f in indexes:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# DVC's records of data (the lock and .dvc pointer files) change with every run; lineage holds their
# hashes itself, so they never make the code "dirty"
NOT_CODE = (":(exclude,glob)**/dvc.lock", ":(exclude,glob)**/*.dvc")


def git_state(root: Path) -> dict[str, Any] | None:
    """HEAD and whether tracked files (code, params) differ from it; None outside a git work tree.
    Untracked files do not count: after a run they are the outputs (DVC writes `.gitignore` files
    beside them) and, where it is not committed, dvc.lock."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    if git("rev-parse", "--show-toplevel") is None:
        return None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", *NOT_CODE) or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit.strip() if commit else None, "dirty": bool(changed), "changed": changed[:50]}


def _stage_run(root: Path, outs: list[dict]) -> str | None:
    for out in outs:
        found = out["md5"] and tracking.output_run(root, out["path"], out["md5"])
        if found:
            return found
    return None


def build_record(root: Path, model_name: str, candidate: str, checkpoint: str) -> dict[str, Any]:
    """The lineage of `checkpoint` (a path relative to `root`) as dvc.lock records it now, with each stage's run."""
    root = Path(root).resolve()
    stages = read_lock(root)
    checkpoint = Path(checkpoint).as_posix()
    order = walk(stages, checkpoint)
    if not order:
        raise UserFacingError(f"{root / 'dvc.lock'}: no stage outputs {checkpoint}, the candidate '{candidate}' of "
                              "reports/eval.json (run the pipeline through DVC)")
    hashes_now = tracking.dvc_hashes(root, [checkpoint])
    chain, runs, kinds = [], {}, {}  # kinds: a dep read by several stages is looked at once
    for stage in order:
        entry = stages[stage]
        outs = [{"path": o["path"], "md5": entry_hash(o)[0]} for o in entry.get("outs", [])]
        runs[stage] = _stage_run(root, outs)
        deps = []
        for d in entry.get("deps", []):
            digest, kind = entry_hash(d)
            made_by = [s for s in producers(stages, d["path"]) if s != stage]
            if d["path"] not in kinds:
                local = _local(d["path"])
                kinds[d["path"]] = ("code" if local and not made_by and _is_code(root, d["path"])
                                    else "checkpoint" if local and _is_checkpoint(root, d["path"]) else "data")
            deps.append({"path": d["path"], "md5": digest, "hash": kind, "kind": kinds[d["path"]], "from": made_by})
        chain.append({"stage": stage, "run_id": runs[stage], "deps": deps, "outs": outs,
                      "params": entry.get("params", {})})
    top = chain[0]
    out = next((o for o in top["outs"] if o["path"] == checkpoint or checkpoint.startswith(o["path"] + "/")),
               top["outs"][0])
    warnings = []
    if out["path"] == checkpoint and hashes_now[checkpoint] != out["md5"]:
        warnings.append(f"{checkpoint} in the working tree ({hashes_now[checkpoint]}) is not what dvc.lock records "
                        f"for stage {top['stage']} ({out['md5']}): it was changed outside DVC")
    params = root / PARAMS_FILE
    return {
        "schema": SCHEMA,
        "model": {"name": model_name, "candidate": candidate},
        "checkpoint": {"path": checkpoint, "md5": hashes_now[checkpoint], "out": out["path"],
                       "out_md5": out["md5"], "stage": top["stage"], "run_id": top["run_id"]},
        "git": git_state(root),
        "dvc_lock_sha256": _sha256((root / "dvc.lock").read_bytes()),
        "params_sha256": _sha256(params.read_bytes()) if params.is_file() else "absent",
        "teacher_index_sha256": teacher_index_sha256(root),
        "stages": chain,
        "warnings": warnings,
    }


def parents(record: dict) -> dict[str, str | None]:
    """Checkpoints the producing stage read (SFT for RL, RL for a merge) -> the run that wrote each."""
    top = record["stages"][0]
    runs = {s["stage"]: s["run_id"] for s in record["stages"]}
    return {d["path"]: runs.get(d["from"][0]) if d["from"] else None
            for d in top["deps"] if d["kind"] == "checkpoint"}


def datasets(record: dict) -> dict[str, str]:
    """Every data input of the chain (nearest stage's hash first) and the teacher cache -> DVC hash."""
    found: dict[str, str] = {}
    for stage in record["stages"]:
        for d in stage["deps"]:
            if d["kind"] == "data" and d["md5"]:
                found.setdefault(d["path"], d["md5"])
        for o in stage["outs"]:
            if o["path"] == TEACHER_CACHE.as_posix() and o["md5"]:
                found.setdefault(o["path"], o["md5"])
    return found


def sources(record: dict) -> list[dict]:
    """Where the chain starts: data no stage writes, and what generator stages (code and params only) wrote."""
    generators = {s["stage"] for s in record["stages"] if all(d["kind"] == "code" for d in s["deps"])}
    seen, found = set(), []
    for stage in record["stages"]:
        for d in stage["deps"]:
            if d["kind"] == "code" or d["path"] in seen:
                continue
            if not d["from"] or all(s in generators for s in d["from"]):
                seen.add(d["path"])
                found.append(d)
    return found


def version_tags(record: dict, record_uri: str) -> dict[str, str]:
    """Short tags for the registered version (MLflow limits tag sizes); the whole chain stays in the record."""
    cp, git = record["checkpoint"], record["git"]
    tags = {
        TAG + "schema": str(record["schema"]),
        TAG + "record": record_uri,
        TAG + "git_commit": (git or {}).get("commit") or "none",
        TAG + "git_dirty": "unknown" if git is None else str(git["dirty"]).lower(),
        TAG + "dvc_lock_sha256": record["dvc_lock_sha256"],
        TAG + "params_sha256": record["params_sha256"],
        TAG + "teacher_index_sha256": record["teacher_index_sha256"],
        TAG + "checkpoint": cp["path"],
        TAG + "checkpoint_md5": cp["md5"] or "absent",
        TAG + "stage": cp["stage"],
        TAG + "run": cp["run_id"] or "unknown",
    }
    for path, run_id in parents(record).items():
        tags[tracking.tag_key(TAG + "parent.", path)] = run_id or "unknown"
    for path, digest in datasets(record).items():
        tags[tracking.tag_key(TAG + "data.", path)] = digest
    return tags


def record_and_tags(root: Path, run, model_name: str, candidate: str, checkpoint: str) -> tuple[dict, dict]:
    """Builds the record, logs it with dvc.lock and params.yaml on `run` (under lineage/), returns (record, tags)."""
    import tempfile

    root = Path(root)
    record = build_record(root, model_name, candidate, checkpoint)
    record["promote_run_id"] = run.run_id
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / RECORD_FILE
        path.write_text(json.dumps(record, indent=2))
        files = [path] + [p for p in (root / "dvc.lock", root / PARAMS_FILE) if p.is_file()]
        tracking.log_artifacts_to(root, run.run_id, files, ARTIFACT_DIR)
    return record, version_tags(record, f"runs:/{run.run_id}/{ARTIFACT_DIR}/{RECORD_FILE}")


# --- reading (`protege lineage`) -----------------------------------------------------------------------------

def _lookup(params: dict, dotted: str) -> tuple[bool, Any]:
    if dotted in params:
        return True, params[dotted]
    node: Any = params
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}"))
        return out
    return {prefix: value}


def _param_changes(root: Path, stages: list[dict]) -> list[dict]:
    """Every param a chain stage read (dvc.lock's record of it) that its file now sets otherwise, or not at all."""
    changes: list[dict] = []
    files: dict[str, Any] = {}
    for stage in stages:
        for file, keys in (stage.get("params") or {}).items():
            if file not in files:
                path = root / file
                files[file] = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else None
            now = files[file]
            for key, was in keys.items():
                found, value = (False, None) if now is None else _lookup(now, key)
                old, new = _flat(was, key), _flat(value, key) if found else {}
                for k in sorted(set(old) | set(new)):
                    if old.get(k, "<unset>") != new.get(k, "<unset>") and not any(
                            c["path"] == f"{file}:{k}" for c in changes):
                        changes.append({"path": f"{file}:{k}", "kind": "param", "stage": stage["stage"],
                                        "recorded": old.get(k, "<unset>"), "current": new.get(k, "<unset>")})
    return changes


def _status(recorded: str | None, current: str | None, kind: str, path: str) -> str:
    if kind != "md5" or not _local(path) or not recorded:
        return "unchecked"
    if current is None:
        return "missing"
    return "ok" if current == recorded else "changed"


def check(root: Path, record: dict) -> dict[str, Any]:
    """The record with each path's hash in the working tree now, and a list of what no longer matches."""
    root = Path(root).resolve()
    read_lock(root)  # the project must be the pipeline's folder
    record = json.loads(json.dumps(record))  # a copy to annotate
    cp = record["checkpoint"]
    paths = {cp["path"]} | {d["path"] for s in record["stages"] for d in s["deps"] if _local(d["path"])}
    now = tracking.dvc_hashes(root, sorted(paths))
    mismatches: list[dict] = []
    seen: set[str] = set()

    def note(path: str, recorded: str | None, status: str, kind: str) -> None:
        if status in ("changed", "missing") and path not in seen:
            seen.add(path)
            mismatches.append({"path": path, "kind": kind, "recorded": recorded, "current": now.get(path)})

    cp["current"] = now[cp["path"]]
    cp["status"] = _status(cp["md5"], cp["current"], "md5", cp["path"])
    note(cp["path"], cp["md5"], cp["status"], "checkpoint")
    for stage in record["stages"]:
        for d in stage["deps"]:
            d["current"] = now.get(d["path"])
            d["status"] = _status(d["md5"], d["current"], d["hash"], d["path"])
            note(d["path"], d["md5"], d["status"], d["kind"])
    warnings = list(record.get("warnings", []))
    for m in mismatches:
        state = "is missing" if m["current"] is None else f"is now {m['current']}"
        warnings.append(f"{m['path']}: recorded {m['recorded']}, the working tree {state}")
    teacher_now = teacher_index_sha256(root)
    if teacher_now != record["teacher_index_sha256"]:
        mismatches.append({"path": f"{TEACHER_CACHE.as_posix()}/*/index.json", "kind": "teacher_index",
                           "recorded": record["teacher_index_sha256"], "current": teacher_now})
        warnings.append(f"teacher cache index: recorded sha256 {record['teacher_index_sha256']}, now {teacher_now}")
    for change in _param_changes(root, record["stages"]):
        mismatches.append(change)
        warnings.append(f"{change['path']} (read by {change['stage']}): recorded {change['recorded']!r}, "
                        f"now {change['current']!r}")
    params = root / PARAMS_FILE
    params_now = _sha256(params.read_bytes()) if params.is_file() else "absent"
    if params_now != record["params_sha256"]:
        mismatches.append({"path": PARAMS_FILE, "kind": "params_file", "recorded": record["params_sha256"],
                           "current": params_now})
        keys = any(m["kind"] == "param" and m["path"].startswith(PARAMS_FILE + ":") for m in mismatches)
        warnings.append(f"{PARAMS_FILE}: recorded sha256 {record['params_sha256']}, now {params_now}"
                        + ("" if keys else " (no key this model's stages read changed)"))
    git = git_state(root)
    record.update({"sources": sources(record), "mismatches": mismatches, "warnings": warnings,
                   "now": {"git": git, "params_sha256": params_now, "teacher_index_sha256": teacher_now,
                           "dvc_lock_sha256": _sha256((root / "dvc.lock").read_bytes())}})
    return record


def lineage_of(root: Path, model_uri: str) -> dict[str, Any]:
    """The checked lineage of a registered version (`models:/NAME@ALIAS` or `models:/NAME/VERSION`)."""
    root = Path(root).resolve()
    read_lock(root)
    mv = tracking.model_version(root, model_uri)
    where = f"{mv['name']} v{mv['version']}"
    uri = mv["tags"].get(TAG + "record")
    if not uri:
        raise UserFacingError(f"{where} has no lineage tags ({TAG}*): it was registered before lineage was "
                              "recorded, or not by `protege stage promote`")
    try:
        record = json.loads(tracking.read_artifact_text(root, uri))
    except json.JSONDecodeError as exc:
        raise UserFacingError(f"{uri}: not valid JSON ({exc})") from None
    if record.get("schema") != SCHEMA:
        raise UserFacingError(f"{uri}: lineage schema {record.get('schema')!r}, this protege reads {SCHEMA}")
    report = check(root, record)
    report["model"].update({"uri": model_uri, "version": mv["version"], "aliases": mv["aliases"], "record": uri})
    return report


# --- text ----------------------------------------------------------------------------------------------------

def _mark(status: str, current: str | None) -> str:
    return {"ok": "ok", "unchecked": "not checked", "missing": "MISSING"}.get(status, f"CHANGED, now {current}")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)] if rows else []
    return ["  " + "  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in rows]


def _param_names(stage: dict) -> str:
    return ", ".join(k if file == PARAMS_FILE else f"{file}:{k}"
                     for file, keys in (stage.get("params") or {}).items() for k in keys)


def render(report: dict) -> str:
    """The text form: the checkpoint, then each stage with what it read and who wrote it, then the sources."""
    m, cp, git = report["model"], report["checkpoint"], report["git"]
    gtext = "no git repository" if not git else f"git {(git['commit'] or 'no commit')[:12]}" + (
        " (uncommitted changes)" if git["dirty"] else "")
    lines = [
        f"{m['name']} v{m['version']}  aliases: {', '.join(m['aliases']) or 'none'}  candidate: {m['candidate']}",
        f"recorded: {gtext} · dvc.lock sha256 {report['dvc_lock_sha256'][:16]} · params.yaml sha256 "
        f"{report['params_sha256'][:16]} · teacher index sha256 {report['teacher_index_sha256'][:16]}",
        "",
        f"{cp['path']}  {cp['md5']}  {_mark(cp['status'], cp['current'])}",
        f"  written by {cp['stage']} (run {cp['run_id'] or 'unknown'})",
    ]
    for stage in report["stages"]:
        params = _param_names(stage)
        changed = [c["path"] for c in report["mismatches"] if c["kind"] == "param" and c["stage"] == stage["stage"]]
        lines += ["", f"{stage['stage']}  run {stage['run_id'] or 'unknown'}"
                  + (f"  params: {params}" if params else "") + (f"  CHANGED: {', '.join(changed)}" if changed else "")]
        lines += _table([(d["path"], d["md5"] or "-", _mark(d["status"], d["current"]),
                          f"<- {', '.join(d['from'])}" if d["from"] else "<- no stage (source)")
                         for d in stage["deps"] if d["kind"] != "code"])
        code = [d for d in stage["deps"] if d["kind"] == "code"]
        if code:
            changed = [d["path"] for d in code if d["status"] in ("changed", "missing")]
            lines.append(f"  code: {len(code)} path{'s' * (len(code) != 1)}, "
                         + (f"changed: {', '.join(changed)}" if changed else "all match"))
    lines += ["", "sources (the data the chain starts from):"]
    lines += _table([(d["path"], d["md5"] or "-", _mark(d["status"], d["current"]),
                      f"written by {', '.join(d['from'])} from code and params only" if d["from"]
                      else "no stage writes it") for d in report["sources"]])
    checked = {d["path"] for s in report["stages"] for d in s["deps"] if d["status"] != "unchecked"} | {cp["path"]}
    lines.append("")
    if report["mismatches"]:
        lines.append(f"{len(report['mismatches'])} recorded value(s) no longer match the working tree (warnings on "
                     "stderr)")
    else:
        lines.append(f"all {len(checked)} recorded paths, the params and the teacher index match the working tree")
    return "\n".join(lines)
