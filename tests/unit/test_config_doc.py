"""docs/configuration.md is the rendering of the config schema: a setting added, renamed or given another
default without the page following fails here (`python -m protege.config_doc > docs/configuration.md`)."""
from protege.config import Config
from protege.config_doc import render
from tests.conftest import REPO


def test_the_committed_page_is_the_schemas_rendering():
    assert (REPO / "docs" / "configuration.md").read_text() == render()


def test_every_setting_has_a_row():
    page = render()
    for key in ("rl.micro_batch_tokens", "agent.rl.gtr.kl_target", "agent.rl.ppo.objective", "data.source"):
        assert f"| `{key}` |" in page
    assert page.count("| `") >= len(Config.model_fields)
