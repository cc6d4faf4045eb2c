"""Preconditions of a study's claims: each kind met, not met and without data on hand-made runs, the seeds
rule, a claim whose precondition fails reads "precondition not met" with the measurement, one-line spec errors,
and the curves' pictures from synthetic step records."""
import json
import shutil

import pytest

from protege.config import ConfigError
from protege.study.preconditions import MET, NOT_MEASURED, NOT_MET, PRECONDITION_NOT_MET, evaluate, measure
from protege.study.spec import Precondition, load_study
from tests.conftest import REPO

STUDY = """
task: agent
seeds: [1, 2, 3]
baseline: plain
bootstrap: 100
common: {agent.rl.eval_every: 2}
variants:
  warm_start: {train: false}
  plain: {agent.rl.gtr.guidance: none}
  gtr_kl: {agent.rl.gtr.guidance: kl}
preconditions:
  - {name: collapses, variant: plain, metric: distinct_thoughts_per_state, kind: collapse, ratio: 0.5, window: 2}
  - {name: teacher_leads, variant: gtr_kl, metric: teacher_eval_success, than: eval_success,
     kind: at_least_part_of_run}
claims:
  - {name: kl beats plain, better: gtr_kl, than: plain, requires: [collapses, teacher_leads]}
  - {name: kl keeps entropy, better: gtr_kl, than: plain, metric: entropy}
"""


@pytest.fixture
def project(tmp_path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def pre(**kw):
    return Precondition(**{"name": "p", "variant": "v", "metric": "m", "kind": "collapse", **kw})


def run(curve=None, upstream=None):
    return {"curve": curve, "upstream_metrics": upstream or {}}


def rows(metric, values, start=1):
    return [{"step": start + i, metric: v} for i, v in enumerate(values)]


def test_collapse_compares_the_means_of_the_first_and_last_window():
    down = pre(metric="d", ratio=0.5, window=2)
    # start (1.0 + 0.8) / 2 = 0.9, end (0.5 + 0.3) / 2 = 0.4 <= 0.45: met
    m = measure(down, run(rows("d", [1.0, 0.8, 0.7, 0.5, 0.3])))
    assert m["met"] is True and m["start"] == pytest.approx(0.9) and m["end"] == pytest.approx(0.4)
    assert m["start_step"] == 1 and m["end_step"] == 5
    assert measure(down, run(rows("d", [1.0, 0.8, 0.7, 0.5, 0.5])))["met"] is False  # end 0.5 > 0.45
    assert measure(down, run(rows("d", [1.0, 0.8, 0.7])))["met"] is None  # fewer than 2 x window points
    assert measure(down, run(None))["met"] is None and measure(down, run(rows("other", [1, 1, 1, 1])))["met"] is None
    up = pre(metric="b", direction="up", ratio=1.5, threshold=0.6)
    assert measure(up, run(rows("b", [0.4, 0.5, 0.61])))["met"] is True  # 0.61 >= 0.6 and >= 1.5 x 0.4
    assert measure(up, run(rows("b", [0.2, 0.5, 0.59])))["met"] is False  # >= 0.3 but not >= 0.6: both must hold
    assert measure(pre(metric="b", threshold=0.1), run(rows("b", [0.4, 0.05])))["met"] is True


def test_at_least_part_of_run_needs_the_metric_at_or_above_the_other_at_enough_points():
    p = pre(kind="at_least_part_of_run", metric="teacher", than="policy")
    curve = [{"step": 1, "reward": 0.1}, {"step": 2, "teacher": 0.2, "policy": 0.3},
             {"step": 4, "teacher": 0.5, "policy": 0.5}, {"step": 6, "teacher": 0.4, "policy": 0.6}]
    m = measure(p, run(curve))
    assert m["met"] is True and m["points"] == 3 and m["ahead"] == 1 and m["steps"] == [4]  # a tie counts
    assert measure(pre(kind="at_least_part_of_run", metric="teacher", than="policy", points=2), run(curve))["met"] is False
    assert measure(p, run([{"step": 2, "teacher": 0.9}]))["met"] is None  # never both at one step
    # neither solving anything is a tie at zero: it shows no teacher worth following
    zeros = [{"step": s, "teacher": 0.0, "policy": 0.0} for s in (0, 10, 20)]
    assert measure(p, run(zeros)) == {"met": False, "points": 3, "ahead": 0, "steps": [], "max_gap": 0.0}


def test_above_and_between_on_a_curve_point_or_an_upstream_figure():
    auroc = pre(kind="above", metric="disc_pretrain.heldout_auroc", threshold=0.6)
    assert measure(auroc, run(upstream={"disc_pretrain": {"heldout_auroc": 0.64}})) == {"met": True, "value": 0.64}
    assert measure(auroc, run(upstream={"disc_pretrain": {"heldout_auroc": 0.6}}))["met"] is False  # strictly above
    assert measure(auroc, run())["met"] is None
    sim = pre(kind="between", metric="sim", lo=0.3, hi=0.7)
    assert measure(sim, run(rows("sim", [0.3, 0.9]))) == {"met": True, "value": 0.3, "step": 1}  # the first step
    assert measure(pre(kind="between", metric="sim", lo=0.3, hi=0.7, at="last"), run(rows("sim", [0.3, 0.9])))["met"] is False
    assert measure(sim, run(rows("sim", [0.75])))["met"] is False and measure(sim, run([]))["met"] is None


def test_met_on_a_majority_of_seeds_or_on_every_seed(project):
    study = load_study(write(project), project)
    p = next(x for x in study.preconditions if x.name == "collapses")
    ok, bad = run(rows("distinct_thoughts_per_state", [1, 1, 0.3, 0.3])), run(rows("distinct_thoughts_per_state", [1, 1, 1, 1]))
    results = {"plain/seed-1": ok, "plain/seed-2": ok, "plain/seed-3": bad}
    e = evaluate(study, p, results)
    assert (e["status"], e["met_on"], e["seeds"]) == (MET, 2, 3) and e["per_seed"]["3"]["met"] is False
    from dataclasses import replace

    assert evaluate(study, replace(p, seeds="all"), results)["status"] == NOT_MET
    # a seed without the data counts as not met; no data at all: not measured
    assert evaluate(study, p, {"plain/seed-1": ok, "plain/seed-2": run(None)})["status"] == NOT_MET
    assert evaluate(study, p, {"plain/seed-1": run(None)})["status"] == NOT_MEASURED
    assert evaluate(study, p, {})["status"] == NOT_MEASURED and "falls: end <= 0.5 x start" in e["criterion"]


def write(project, text=STUDY):
    path = project / "s.yaml"
    path.write_text(text)
    return path


def evaluation(successes, entropy=0.1):
    eps = [{"seed": i, "success": bool(s), "entropy": entropy, "format_errors": 0, "turns": 2}
           for i, s in enumerate(successes)]
    return {"per_episode": eps, "success_rate": sum(successes) / len(successes), "entropy": entropy}


def results(collapse: bool) -> dict:
    """Three seeds of each variant: gtr_kl solves more held-out layouts; plain's thoughts collapse or not;
    gtr_kl's teacher leads its policy at step 4."""
    out = {"warm_start/seed-1": {"train": False, "agent": {"start": evaluation([1, 0, 0, 0] * 5)}}}
    for seed in (1, 2, 3):
        distinct = [1.0, 0.9, 0.4, 0.3] if collapse else [1.0, 0.9, 0.9, 0.8]
        out[f"plain/seed-{seed}"] = {
            "train": True, "agent": {"start": evaluation([1, 0, 0, 0] * 5), "end": evaluation([1, 0, 0, 0] * 5)},
            "curve": [{"step": s + 1, "distinct_thoughts_per_state": d, "thought_entropy": 0.5 - 0.1 * s,
                       "thought_self_bleu": 0.2 + 0.1 * s, "thought_tokens": 10 - s} for s, d in enumerate(distinct)]
            + [{"step": 2, "eval_success": 0.25}]}
        curve = [{"step": s + 1, "distinct_thoughts_per_state": 1.0, "thought_entropy": 0.5, "thought_self_bleu": 0.2,
                  "thought_tokens": 10} for s in range(4)]
        curve[1].update(eval_success=0.5, teacher_eval_success=0.25)
        curve[3].update(eval_success=0.5, teacher_eval_success=0.75)
        out[f"gtr_kl/seed-{seed}"] = {"train": True, "curve": curve,
                                      "agent": {"start": evaluation([1, 0, 0, 0] * 5),
                                                "end": evaluation([1, 1, 1, 0] * 5)}}
    return out


def test_a_claim_whose_precondition_fails_says_so_with_the_measurement(project):
    from protege.study.report import markdown
    from protege.study.agent_report import build_agent_report

    study = load_study(write(project), project)
    met = build_agent_report(study, results(collapse=True), [])
    assert [p["status"] for p in met["preconditions"]] == [MET, MET]
    assert met["claims"][0]["verdict"] == "reproduced" and met["claims"][0]["requires"][0]["met_on"] == 3
    failed = build_agent_report(study, results(collapse=False), [])
    claim = failed["claims"][0]
    assert claim["verdict"] == PRECONDITION_NOT_MET and claim["unmet"] == ["collapses"]
    assert claim["diff"] == met["claims"][0]["diff"]  # measured all the same, not judged
    assert failed["claims"][1]["verdict"] != PRECONDITION_NOT_MET  # requires nothing
    md = markdown(failed)
    assert ("**precondition not met** (collapses: 0.95 -> 0.85, 0.95 -> 0.85, 0.95 -> 0.85; needs "
            "distinct_thoughts_per_state falls: end <= 0.5 x start") in md
    assert "| `collapses` | `plain` |" in md and "**not met** (on 0 of 3 seeds; needs more than half of the seeds)" in md
    assert "`teacher_leads` met (3/3 seeds)" in md
    assert "![collapse curves of `s`](s.collapse.png)" in md and "![teacher curves of `s`](s.teacher.png)" in md
    # the curves: mean over seeds per step, the held-out points where they were taken
    assert failed["curves"]["gtr_kl"]["teacher_eval_success"] == [[2, 0.25, 3], [4, 0.75, 3]]
    assert failed["curves"]["plain"]["eval_success"] == [[2, 0.25, 3]] and "warm_start" not in failed["curves"]


def test_the_results_table_shows_each_claims_preconditions_and_verdict(project):
    from protege.study.agent_report import build_agent_report
    from protege.study.results import suite_markdown
    from protege.study.spec import Suite

    study = load_study(write(project), project)
    study.part = "gtr"
    report = build_agent_report(study, results(collapse=False), [])
    suite = Suite(project / "h.yaml", project, "h", "", [study], project / "reports/results.md")
    md = suite_markdown(suite, {"gtr": report})
    row = next(line for line in md.splitlines() if line.startswith("| gtr | kl beats plain"))
    assert "| `collapses` **not met** (0/3 seeds); `teacher_leads` met (3/3 seeds) |" in row
    assert "| gtr_kl - plain: +50.0 |" in row and "**precondition not met** (collapses: 0.95 -> 0.85" in row
    assert "### Preconditions" in md and "![collapse curves of `s`](results.gtr.collapse.png)" in md


def test_the_report_writes_the_curves_pictures(project):
    from protege.study.agent_report import build_agent_report
    from protege.study.report import write_report

    study = load_study(write(project), project)
    report = build_agent_report(study, results(collapse=True), [])
    paths = write_report(report, study.report_paths())
    assert json.loads(paths["json"].read_text())["figures"] == ["collapse", "teacher"]
    for key in ("collapse", "teacher"):
        picture = paths["md"].with_name(f"s.{key}.png")
        assert picture.exists() and picture.stat().st_size > 1000
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not paths["md"].with_name("s.signal.png").exists()  # no RIL curve in an agent study


@pytest.mark.parametrize("change, expected", [
    (("variant: plain, metric: distinct", "variant: plane, metric: distinct"),
     "preconditions[0].variant 'plane' is not a variant"),
    (("metric: distinct_thoughts_per_state", "metric: distinct_thoughts"),
     "preconditions[0].metric 'distinct_thoughts' is not a metric an agent study's runs record"),
    (("than: eval_success", "than: success"), "preconditions[1].than 'success' is not a metric"),
    (("kind: collapse", "kind: collapsed"), "key 'preconditions.0.kind'"),
    (("ratio: 0.5, window: 2", "window: 2"), "preconditions[0]: kind collapse needs ratio"),
    (("ratio: 0.5, window: 2", "ratio: 0.5, lo: 0.3"), "preconditions[0].lo does not apply to kind collapse"),
    (("ratio: 0.5, window: 2", "ratio: 0.5, colour: red"), "unknown key 'preconditions.0.colour'"),
    (("variant: plain, metric: distinct", "variant: warm_start, metric: distinct"),
     "preconditions[0].variant 'warm_start' does not train"),
    (("requires: [collapses, teacher_leads]", "requires: [collapse]"),
     "claims[0].requires 'collapse' is not a precondition (preconditions: collapses, teacher_leads)"),
    (("name: teacher_leads", "name: collapses"), "preconditions[1].name 'collapses' is given twice"),
    (("kind: at_least_part_of_run", "kind: above"), "preconditions[1].than does not apply to kind above"),
])
def test_bad_preconditions_are_one_line_naming_the_field(project, change, expected):
    old, new = change
    assert old in STUDY
    path = write(project, STUDY.replace(old, new))
    with pytest.raises(ConfigError) as exc:
        load_study(path, project)
    msg = str(exc.value)
    assert expected in msg and msg.startswith(str(path)) and "\n" not in msg, msg


def test_qa_preconditions_read_the_discriminator_and_the_similarity_reward(project):
    text = """
seeds: [1]
baseline: ril
variants:
  sft: {train: false}
  ril: {rl.algorithm: ril}
preconditions:
  - {name: auroc, variant: ril, metric: disc_pretrain.heldout_auroc, kind: above, threshold: 0.6}
  - {name: sim, variant: ril, metric: similarity_reward_student, kind: between, lo: 0.3, hi: 0.7}
claims:
  - {better: ril, than: sft, requires: [auroc, sim]}
"""
    study = load_study(write(project, text), project)
    assert [p.kind for p in study.preconditions] == ["above", "between"] and study.claims[0].requires == ("auroc", "sim")
    with pytest.raises(ConfigError, match="is one figure, not a curve: use kind above or between"):
        load_study(write(project, text.replace("kind: above, threshold: 0.6", "kind: collapse, ratio: 0.5")), project)
    with pytest.raises(ConfigError, match="kind between needs lo <= hi"):
        load_study(write(project, text.replace("lo: 0.3, hi: 0.7", "lo: 0.7, hi: 0.3")), project)
