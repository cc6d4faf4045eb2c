"""The README's demo excerpt is written from a demo's own reports: each row after - before with its paired CI
and verdict, the measured spread across machines, between the README's markers."""
import json

import pytest

from protege.errors import UserFacingError
from protege.eval import demo_excerpt


def project(tmp_path, start, end):
    (tmp_path / "reports" / "agent").mkdir(parents=True)
    (tmp_path / "reports" / "eval.json").write_text(json.dumps({"differences": {
        "rl_final - sft": {"world_test": {"diff": -1.25, "ci": [-3.0, 0.5]}}}}))
    per = lambda xs: [{"seed": i, "success": x} for i, x in enumerate(xs)]
    (tmp_path / "reports" / "agent" / "summary.json").write_text(json.dumps({
        "start": {"success_rate": sum(start) / len(start), "per_episode": per(start)},
        "end": {"success_rate": sum(end) / len(end), "per_episode": per(end)}}))
    return tmp_path


def test_rows_are_the_reports_differences_with_their_verdicts(tmp_path):
    # 10 layouts: the RL checkpoint solves 4 more, loses none: +40 points, every resample above zero
    rows = demo_excerpt.rows(project(tmp_path, [1, 1, 0, 0, 0, 0, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1, 1, 0, 1, 0]))
    assert rows[0].startswith("world test split: rl_final - sft") and "-1.2 points [ -3.0,  +0.5]" in rows[0]
    assert rows[0].endswith("CI crosses zero")
    assert rows[1].startswith("agent game: last RL checkpoint - warm start") and "+40.0 points" in rows[1]
    assert rows[1].endswith("CI above zero") and len(rows) == 2  # no tool summary, no merged teacher


def test_spread_and_the_readme_markers(tmp_path):
    runs = [{"machine": "A", "figures": {"tool warm start (%)": 47.5}},
            {"machine": "B", "figures": {"tool warm start (%)": 66.0}}]
    text = demo_excerpt.excerpt(project(tmp_path, [1, 0], [1, 1]), runs)
    assert "Across 2 measured fresh-clone runs on 2 machines" in text and "  47.5 to   66.0" in text
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{demo_excerpt.START}\nold rows\n{demo_excerpt.END}\nrest\n")
    demo_excerpt.write(readme, text)
    body = readme.read_text()
    assert "old rows" not in body and text in body and body.startswith("intro\n") and body.endswith("rest\n")


def test_superseded_figures_stay_out_of_the_spread():
    # the agent row before a change of method is on record, but only runs of the current method are compared
    key = "agent game last RL - warm start (points)"
    runs = [{"machine": "A", "figures": {}, "superseded": {key: -5.0}},
            {"machine": "B", "figures": {key: 1.5}}, {"machine": "C", "figures": {key: 0.5}}]
    lines = demo_excerpt.spread(runs)
    assert any(key in line and "+0.5 to   +1.5" in line for line in lines), lines
    assert not any("-5.0" in line for line in lines)


def test_missing_reports_and_markers_are_named(tmp_path):
    with pytest.raises(UserFacingError, match="reports/eval.json is missing: run `make demo`"):
        demo_excerpt.rows(tmp_path)
    (tmp_path / "README.md").write_text("no markers")
    with pytest.raises(UserFacingError, match="has no demo excerpt markers"):
        demo_excerpt.write(tmp_path / "README.md", "x")


def test_the_readme_carries_the_markers():
    from pathlib import Path

    body = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert demo_excerpt.START in body and demo_excerpt.END in body
