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


def test_descriptions_come_from_the_params_comments():
    from protege.config_doc import params_comments

    text = """top: 1        # the top key
              # and its second line
sec:               # a section
  # above the key
  a: x             # "quoted # not a comment" stays out
  b: "v # w"
  c: {d: 1, e: 2}  # a one-line mapping
  f: 3
                   # continues nothing: f has no comment, so it goes to g
  g: 4
"""
    c = params_comments(text)
    assert c["top"] == "the top key and its second line"
    assert c["sec"] == "a section"
    assert c["sec.a"] == '"quoted # not a comment" stays out'
    assert c["sec.b"] == ""
    assert c["sec.c.d"] == c["sec.c.e"] == c["sec.c"] == "a one-line mapping"
    assert c["sec.f"] == ""
    assert c["sec.g"] == "continues nothing: f has no comment, so it goes to g"


def test_the_page_shows_what_each_setting_does():
    page = render()
    assert "| `rl.max_new_tokens` | int | `16` | results | the world's answers" in page
    assert "| `threads` | int | `1` | nothing | torch threads per stage process" in page
