"""The README's demo excerpt, written from a finished demo's own reports: each post-training row as
after - before with its paired 95% CI and whether that CI is above zero, then how far the same rows have moved
between machines (docs/demo-runs.json: every measured fresh-clone demo run, the machine and commit it ran on).

    python -m protege.eval.demo_excerpt [PROJECT]                 # print the excerpt of PROJECT's reports
    python -m protege.eval.demo_excerpt [PROJECT] --write README.md  # replace the README's excerpt with it
"""
from __future__ import annotations

import json
from pathlib import Path

from protege.errors import UserFacingError
from protege.eval.report import verdict
from protege.eval.stats import paired_bootstrap
from protege.paths import EVAL_JSON

START, END = "<!-- demo-excerpt:start (python -m protege.eval.demo_excerpt . --write README.md) -->", \
    "<!-- demo-excerpt:end -->"
GAMES = (("agent game", "reports/agent/summary.json"), ("tool environment", "reports/tool/summary.json"))
RUNS = Path(__file__).resolve().parents[2] / "docs" / "demo-runs.json"


def _row(label: str, d: dict) -> str:
    lo, hi = d["ci"]
    return f"{label:50s} {d['diff']:+5.1f} points [{lo:+5.1f}, {hi:+5.1f}]  {verdict(d['ci'])}"


def rows(project: Path) -> list[str]:
    """One line per post-training comparison of the demo: the world test split's, then each game's."""
    path = project / EVAL_JSON
    if not path.is_file():
        raise UserFacingError(f"{path} is missing: run `make demo` (or `protege pipeline`) first")
    out = []
    for label, d in json.loads(path.read_text())["differences"].items():
        if "world_test" in d:
            out.append(_row(f"world test split: {label}", d["world_test"]))
    for game, rel in GAMES:
        summary = project / rel
        if not summary.is_file():
            continue
        s = json.loads(summary.read_text())
        start = {str(e["seed"]): float(e["success"]) for e in s["start"]["per_episode"]}
        for key, name in (("end", "last RL checkpoint"), ("merged_teacher", "merged teacher")):
            if s.get(key) and "per_episode" in s[key]:
                after = {str(e["seed"]): float(e["success"]) for e in s[key]["per_episode"]}
                out.append(_row(f"{game}: {name} - warm start", paired_bootstrap(start, after)))
    return out


def spread(runs: list[dict]) -> list[str]:
    """How far each row moved across the measured runs (each a fresh clone on one machine). A run's
    `superseded` figures were computed by a method that has changed since; they stay on record, out of the
    spread."""
    if len(runs) < 2:
        return []
    machines = sorted({r["machine"] for r in runs})
    lines = [f"Across {len(runs)} measured fresh-clone runs on {len(machines)} machines at the same seed "
             f"(docs/demo-runs.json), the same rows moved:"]
    for key in sorted({k for r in runs for k in r["figures"]}):
        values = [r["figures"][key] for r in runs if key in r["figures"]]
        sign = "" if key.endswith("(%)") else "+"  # a difference is signed, a level is not
        if len(values) > 1:
            lines.append(f"  {key:48s} {min(values):{sign}6.1f} to {max(values):{sign}6.1f}")
    return lines + ["The CPU's kernels differ between machines; on one machine every stage is bitwise "
                    "reproducible (docs/demo.md). Read a row's CI, not its digits."]


def excerpt(project: Path, runs: list[dict]) -> str:
    return "\n".join(["```", *rows(project), *([""] + spread(runs) if len(runs) > 1 else []), "```"])


def write(readme: Path, text: str) -> None:
    body = readme.read_text()
    if START not in body or END not in body:
        raise UserFacingError(f"{readme} has no demo excerpt markers ({START} ... {END})")
    head, rest = body.split(START, 1)
    readme.write_text(head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m protege.eval.demo_excerpt", description=__doc__.split("\n")[0])
    parser.add_argument("project", nargs="?", default=".", help="a project where the demo ran (default: here)")
    parser.add_argument("--write", metavar="README", help="replace the excerpt between the markers of this file")
    args = parser.parse_args(argv)
    text = excerpt(Path(args.project), json.loads(RUNS.read_text()) if RUNS.is_file() else [])
    if args.write:
        write(Path(args.write), text)
    else:
        print(text)


if __name__ == "__main__":
    main()
