"""Two evaluations side by side: per benchmark and on average, B - A with a paired bootstrap.

Each side is a folder with one sub-folder per benchmark holding `units.json` (unit id -> score), the
layout `protege eval run` and the evaluate stage write and log to MLflow under `eval/`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from protege.errors import UserFacingError
from protege.bench.items import BENCHMARKS
from protege.eval.stats import paired_bootstrap, percentile_ci


def read_units(folder: Path) -> dict[str, dict[str, float]]:
    """benchmark -> {unit id: score} for every benchmark folder under `folder`."""
    out = {}
    for name in BENCHMARKS:
        f = Path(folder) / name / "units.json"
        if f.exists():
            out[name] = json.loads(f.read_text())
    if not out:
        raise UserFacingError(f"{folder}: no benchmark results (expected NAME/units.json for a benchmark NAME)")
    return out


def read_sources(folder: Path) -> dict[str, str]:
    """benchmark -> the data file its summary names (to warn when two runs scored different files)."""
    out = {}
    for name in BENCHMARKS:
        f = Path(folder) / name / "summary.json"
        if f.exists():
            out[name] = json.loads(f.read_text()).get("data", "")
    return out


def compare(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]], n_boot: int = 1000,
            seed: int = 0, sources_a: dict[str, str] | None = None, sources_b: dict[str, str] | None = None) -> dict:
    """Per benchmark, B - A over the units both scored. Benchmarks with no unit in common are left out
    with a warning, as are mismatched data files named (the same ids may then be other questions)."""
    warnings = []
    shared = []
    for n in BENCHMARKS:
        if n not in a or n not in b:
            continue
        if not set(a[n]) & set(b[n]):
            warnings.append(f"{n}: no scored item in common (different files?); left out")
            continue
        fa, fb = (sources_a or {}).get(n, ""), (sources_b or {}).get(n, "")
        if fa and fb and Path(fa).name != Path(fb).name:
            warnings.append(f"{n}: A scored {fa}, B scored {fb}; items are paired by index")
        shared.append(n)
    if not shared:
        raise UserFacingError(f"the two evaluations share no benchmark with common items (A: {sorted(a)}, "
                              f"B: {sorted(b)})" + ("; " + "; ".join(warnings) if warnings else ""))
    rng = np.random.default_rng(seed)
    per, reps = {}, []
    for name in shared:
        per[name] = paired_bootstrap(a[name], b[name], n_boot, seed)
        keys = sorted(set(a[name]) & set(b[name]))
        diff = 100 * np.array([b[name][k] - a[name][k] for k in keys])
        reps.append(diff[rng.integers(0, len(keys), size=(n_boot, len(keys)))].mean(axis=1))
    avg_reps = np.mean(reps, axis=0)
    lo, hi = percentile_ci(avg_reps)
    return {"benchmarks": per, "average": {"diff": float(np.mean([per[n]["diff"] for n in shared])),
                                           "ci": [lo, hi], "p_b_not_better": float((avg_reps <= 0).mean()),
                                           "benchmarks": len(shared)},
            "only_a": sorted(set(a) - set(b)), "only_b": sorted(set(b) - set(a)), "warnings": warnings}


def markdown(result: dict, label_a: str, label_b: str) -> str:
    lines = [(f"B = {label_b} vs A = {label_a}: difference B - A in points, 95% paired-bootstrap CI over the "
              "items both scored (means over items: MMStar's report score is a mean over categories)"), "",
             "| benchmark | n | only A / only B | A | B | B - A | 95% CI | P(B not better) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in result["benchmarks"].items():
        lines.append(f"| {name} | {r['n']} | {r['only_a']} / {r['only_b']} | {r['a']:.1f} | {r['b']:.1f} | "
                     f"{r['diff']:+.1f} | [{r['ci'][0]:+.1f}, {r['ci'][1]:+.1f}] | {r['p_b_not_better']:.3f} |")
    avg = result["average"]
    lines.append(f"| **average** ({avg['benchmarks']}) | | | | | **{avg['diff']:+.2f}** | "
                 f"[{avg['ci'][0]:+.2f}, {avg['ci'][1]:+.2f}] | {avg['p_b_not_better']:.3f} |")
    for w in result.get("warnings", []):
        lines.append(f"\nWarning: {w}")
    for side in ("only_a", "only_b"):
        if result[side]:
            lines.append(f"\nOnly in {side[-1].upper()}: {', '.join(result[side])}")
    return "\n".join(lines) + "\n"
