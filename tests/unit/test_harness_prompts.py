"""lmms-eval's judge prompts are read from the installed harness and checked against 0.7.3's text."""
import pytest

from protege.errors import UserFacingError
from protege.bench.items import BenchItem
from protege.eval.scorers import harness_prompts, scorer_for


@pytest.fixture(autouse=True)
def fresh_cache():
    harness_prompts.lmms_eval_prompt.cache_clear()
    yield
    harness_prompts.lmms_eval_prompt.cache_clear()


def test_missing_harness_is_a_clear_error_only_when_a_judge_is_asked(monkeypatch):
    monkeypatch.setattr(harness_prompts, "_package_dir", lambda: None)
    item = BenchItem(benchmark="mmvet", index="1", question="Q?", images=[], answer="3")
    assert scorer_for("mmvet").score([item], ["3"])[0].score == 1.0          # no judge: rules, no prompt needed
    with pytest.raises(UserFacingError, match=r"not installed: install it with `pip install --no-deps lmms-eval==0\.7\.3`"):
        scorer_for("mmvet").score([item], ["3"], lambda prompts: ["1.0"] * len(prompts))
    out = scorer_for("mmvet", "lenient").score([item], ["3"], lambda prompts: ["1.0"] * len(prompts))
    assert out[0].score == 1.0                                               # lenient: protege's own prompt


def test_another_version_of_the_prompt_is_refused(monkeypatch, tmp_path):
    source = tmp_path / "tasks" / "mathvista" / "mathvista_evals.py"
    source.parent.mkdir(parents=True)
    source.write_text('DEMO_PROMPT = """Extract the answer."""\n', encoding="utf-8")
    monkeypatch.setattr(harness_prompts, "_package_dir", lambda: tmp_path)
    with pytest.raises(UserFacingError, match=r"mathvista_evals\.py: the DEMO_PROMPT prompt is not lmms-eval 0\.7\.3's"):
        harness_prompts.lmms_eval_prompt("mathvista")
    source.write_text("DEMO_PROMPT = (\n", encoding="utf-8")
    with pytest.raises(UserFacingError, match="cannot read lmms-eval's mathvista prompt"):
        harness_prompts.lmms_eval_prompt("mathvista")


def test_installed_prompts_are_the_pinned_ones():
    pytest.importorskip("lmms_eval")
    template = harness_prompts.lmms_eval_prompt("mmbench")
    assert template.count("{}") == 3
    assert harness_prompts.lmms_eval_prompt("mmvet") == harness_prompts.lmms_eval_prompt("mmvet_v2")
