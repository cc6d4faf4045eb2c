"""Rewrites dvc.yaml's code deps and params from what each stage really imports and reads
(protege/stage_deps.py). Data deps, outs and comments are kept. Run after adding an import to a stage;
tests/unit/test_dvc_deps.py fails until dvc.yaml covers it.

    python dev/sync_dvc_deps.py          # rewrite dvc.yaml in place
"""
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from protege.stage_deps import code_files, params_read  # noqa: E402

path = Path(__file__).resolve().parents[1] / "dvc.yaml"
lines = path.read_text().splitlines()
stages = yaml.safe_load(path.read_text())["stages"]
out, stage, in_deps = [], None, False
for line in lines:
    m = re.match(r"^  (\w+):", line)
    if m and m.group(1) in stages:
        stage, in_deps = m.group(1), False
    if stage and re.match(r"^    deps:\s*$", line):
        in_deps = True
        out.append(line)
        continue
    if in_deps and re.match(r"^      - protege/", line):
        continue  # replaced below
    if in_deps and not re.match(r"^      - ", line):
        out.extend(f"      - {p}" for p in sorted(map(str, code_files(stage))))
        in_deps = False
    pm = re.match(r"^    params: \[(.*)\](.*)$", line)
    if stage and pm:
        declared = [p.strip() for p in pm.group(1).split(",") if p.strip()]
        need = params_read(stage)
        keep = [p for p in declared if p in need or p.split(".")[0] in need]
        for r in sorted(need):
            if r not in keep and r.split(".")[0] not in keep:
                keep.append(r)
        keep = [p for p in keep if "." not in p or p.split(".")[0] not in keep]
        line = f"    params: [{', '.join(keep)}]{pm.group(2)}"
    out.append(line)
path.write_text("\n".join(out) + "\n")
print(f"rewrote {path}")
