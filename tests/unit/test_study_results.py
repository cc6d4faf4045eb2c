"""The claims table of a file with parts: one row per claim, and for a claim that did not reproduce the
sentence of what was measured (levels, the start, a discriminator at chance, entropy that rose)."""
import copy
from pathlib import Path

from protege.study.results import suite_markdown
from protege.study.spec import Study, Suite


def study(part: str, task: str) -> Study:
    return Study(path=Path("/p/h.yaml"), project=Path("/p"), name=f"h.{part}", seeds=[1, 2], baseline="b", model="rl_final",
                 bootstrap=100, keep_checkpoints=False, description="", common={}, variants={}, claims=[], task=task,
                 part=part)


def stat(mean):
    return {"mean": mean, "ci": [mean - 1, mean + 1]}


QA = {"study": "h.ril", "task": "qa", "description": "", "failed": [], "runs": [{"finished": True}] * 3,
      "variants": {
          "sft": {"train": False, "metrics": {"world_test": stat(63.7)}, "runs_planned": 1, "seeds_finished": [1]},
          "ril": {"train": True, "metrics": {"world_test": stat(64.3)}, "runs_planned": 2, "seeds_finished": [1, 2],
                  "train_rl": {"disc_accuracy_first_quarter": 0.501, "disc_accuracy_last_quarter": 0.504}}},
      "claims": [{"name": "RIL > SFT", "better": "ril", "than": "sft", "metric": "world_test", "margin": 0.0,
                  "diff": 0.6, "ci": [-1.4, 2.6], "pairs": [[1, 1], [1, 2]], "verdict": "inconclusive"}]}
AGENT = {"study": "h.gtr", "task": "agent", "end": "end", "description": "", "failed": [], "runs": [{"finished": True}],
         "variants": {
             "plain": {"train": True, "runs_planned": 2, "seeds_finished": [1, 2],
                       "metrics": {"success.start": stat(76.5), "success.end": stat(75.2),
                                   "entropy.start": stat(0.068), "entropy.end": stat(0.176)}},
             "kl": {"train": True, "runs_planned": 2, "seeds_finished": [1, 2],
                    "metrics": {"success.start": stat(76.5), "success.end": stat(80.0),
                                "entropy.start": stat(0.068), "entropy.end": stat(0.139)}}},
         "claims": [{"name": "kl > plain", "better": "kl", "than": "plain", "metric": "success", "margin": 0.0,
                     "difference": "kl - plain", "diff": 4.8, "ci": [1.0, 8.0], "pairs": [[1, 1], [2, 2]],
                     "verdict": "reproduced"},
                    {"name": "kl keeps entropy", "better": "kl", "than": "plain", "metric": "entropy", "margin": 0.0,
                     "difference": "kl - plain", "diff": -0.037, "ci": [-0.079, 0.002], "pairs": [[1, 1], [2, 2]],
                     "verdict": "inconclusive"}]}


def test_one_row_per_claim_and_a_measured_sentence_for_each_that_did_not_reproduce():
    suite = Suite(Path("/p/h.yaml"), Path("/p"), "h", "", [study("ril", "qa"), study("gtr", "agent"),
                                                            study("gtpo", "tool")], Path("reports/results.md"))
    md = suite_markdown(suite, {"ril": QA, "gtr": AGENT, "gtpo": None})
    rows = [line for line in md.splitlines() if line.startswith("| ril |") or line.startswith("| gtr |")
            or line.startswith("| gtpo |")]
    assert len(rows) == 4 and "| ril - sft: +0.6 | [-1.4, +2.6] (2 seed pairs) | **inconclusive** |" in rows[0]
    assert "**reproduced**" in rows[1] and "| -0.037 |" not in rows[2] and "kl - plain: -0.037" in rows[2]
    assert "(no report yet: run the study)" in rows[3]
    assert ("RIL > SFT: inconclusive. Measured: world test accuracy (%): `ril` 64.3, `sft` 63.7; `ril`'s "
            "discriminator stayed near chance (accuracy 0.50 -> 0.50), so its similarity reward carried no signal; "
            "RL moved `ril` +0.6 points from `sft`.") in md
    assert "kl keeps entropy: inconclusive. Measured: from a warm start at 0.068, `kl` ends at 0.139 and `plain` " \
           "at 0.176" in md and "`plain`'s entropy rose (0.068 -> 0.176) instead of collapsing" in md
    assert "kl > plain: reproduced" not in md  # a reproduced claim needs no explanation


def test_a_discriminator_near_chance_at_its_threshold_that_still_ranks_is_said_so():
    ranked = copy.deepcopy(QA)
    ranked["variants"]["ril"]["train_rl"].update({"disc_auroc_first_quarter": 0.71, "disc_auroc_last_quarter": 0.66})
    suite = Suite(Path("/p/h.yaml"), Path("/p"), "h", "", [study("ril", "qa")], Path("reports/results.md"))
    md = suite_markdown(suite, {"ril": ranked})
    assert ("`ril`'s discriminator was near chance at its threshold (accuracy 0.50 -> 0.50) yet still ranked "
            "student above teacher answers (AUROC 0.66 in the last quarter)") in md
    assert "carried no signal" not in md
    ranked["variants"]["ril"]["train_rl"]["disc_auroc_last_quarter"] = 0.52  # no ranking left either
    md = suite_markdown(suite, {"ril": ranked})
    assert "stayed near chance (accuracy 0.50 -> 0.50, AUROC 0.52 in the last quarter), so its similarity" in md
