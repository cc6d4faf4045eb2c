"""docs/configuration.md, rendered from the config schema: every setting with its type, its default and what it
changes (`affects` on its field). `python -m protege.config_doc > docs/configuration.md`; a unit test keeps the
committed page equal to this rendering."""
from __future__ import annotations

import json

from pydantic import BaseModel

from protege.config import Config, effect_of

HEADER = """# Configuration

Every setting of `params.yaml`, with its type and default (rendered from `protege/config.py`; an unknown key is
an error that names the allowed ones). "changes" says what a different value changes: `results` (the trained
weights, so DVC re-runs the stage), `length` (how far a run goes), `outputs` (which files are written) or
`nothing` (speed, memory, logging, placement). The defaults here are the schema's, and the repository's
`params.yaml` is exactly them: it names every setting with a comment saying what it does, and a test
(`tests/unit/test_params_defaults.py`) fails when the two differ. A key missing from a params file takes its
default here, also inside a sub-section given in part. Some defaults are sized for the demo's tiny world (the
world's sizes, `curate.select`, step counts, `rl.lr`, `rl.max_new_tokens`): set those for your own model and data.
"""


def _rows(section: type[BaseModel], value: BaseModel, prefix: str) -> list[str]:
    rows = []
    for name, field in section.model_fields.items():
        current = getattr(value, name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, current, f"{prefix}{name}.")
            continue
        shown = json.dumps(current.model_dump() if isinstance(current, BaseModel) else
                           [v.model_dump() if isinstance(v, BaseModel) else v for v in current]
                           if isinstance(current, list) else current)
        kind = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {kind} | `{shown}` | {effect_of(section, name)} |")
    return rows


def render() -> str:
    lines = [HEADER]
    cfg = Config()
    for name, field in Config.model_fields.items():
        ann = field.annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            continue
        lines += [f"## `{name}`", "", "| setting | type | default | changes |", "|---|---|---|---|",
                  *_rows(ann, getattr(cfg, name), f"{name}."), ""]
    top = [n for n, f in Config.model_fields.items()
           if not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))]
    lines += ["## top level", "", "| setting | type | default | changes |", "|---|---|---|---|",
              *[f"| `{n}` | {Config.model_fields[n].annotation.__name__} | `{json.dumps(getattr(cfg, n))}` | "
                f"{effect_of(Config, n)} |" for n in top], ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
