"""docs/configuration.md, rendered from the config schema and params.yaml: every setting with its type, its
default, what it changes (`affects` on its field) and what it does (its comment in params.yaml, whose values
are the schema's defaults). `python -m protege.config_doc > docs/configuration.md`; a unit test keeps the
committed page equal to this rendering."""
from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel

from protege.config import Config, effect_of

HEADER = """# Configuration

Every setting of `params.yaml`, with its type and default (rendered from `protege/config.py`; an unknown key is
an error that names the allowed ones). "changes" says what a different value changes: `results` (the trained
weights, so DVC re-runs the stage), `length` (how far a run goes), `outputs` (which files are written) or
`nothing` (speed, memory, logging, placement); "what it does" is the setting's comment in `params.yaml`. The
defaults here are the schema's, and the repository's `params.yaml` is exactly them, and a test
(`tests/unit/test_params_defaults.py`) fails when the two differ. A key missing from a params file takes its
default here, also inside a sub-section given in part. Some defaults are sized for the demo's tiny world (the
world's sizes, `curate.select`, step counts, `rl.lr`, `rl.max_new_tokens`): set those for your own model and data.
"""


PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<rest>.*)$")


def _comment(rest: str) -> tuple[str, int]:
    """The comment after a value (` # ...`), outside quotes, and where its `#` stands in `rest` ('', -1: none)."""
    quote = None
    for i, ch in enumerate(rest):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1] == " "):
            return rest[i + 1:].strip(), i
    return "", -1


def params_comments(text: str) -> dict[str, str]:
    """Dotted key -> its comment in a params file: the comment on the key's line and the comment-only lines
    that continue it (aligned under its `#`), or else the comment lines just above it. A key inside a
    one-line mapping (`grid: {size: 4, ...}`) gets that line's comment."""
    out: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    last: tuple[int, str] | None = None  # (column of its comment's #, dotted key) of the previous key line
    above: list[str] = []                 # comment lines above the next key
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            if last is not None and indent == last[0] and not above:  # aligned under the key's comment
                out[last[1]] += " " + stripped[1:].strip()
            elif indent > 0:
                above.append(stripped[1:].strip())
            continue
        m = KEY_LINE.match(line)
        if not m:
            last, above = None, []
            continue
        path = [(i, k) for i, k in path if i < indent]
        path.append((indent, m["key"]))
        key = ".".join(k for _, k in path)
        comment, at = _comment(m["rest"])
        out[key] = comment or " ".join(above)
        last, above = ((len(line) - len(m["rest"]) + at) if comment else -1, key), []
        value = m["rest"].split(" #")[0].strip()
        if value.startswith("{") and value.endswith("}"):  # a one-line mapping: its keys share the comment
            for sub in re.findall(r"([A-Za-z_]\w*):", value):
                out.setdefault(f"{key}.{sub}", out[key])
    return out


def _described(key: str, comments: dict[str, str]) -> str:
    return comments.get(key, "").replace("|", "\\|")


def _rows(section: type[BaseModel], value: BaseModel, prefix: str, comments: dict[str, str] | None = None) -> list[str]:
    rows = []
    for name, field in section.model_fields.items():
        current = getattr(value, name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, current, f"{prefix}{name}.", comments)
            continue
        shown = json.dumps(current.model_dump() if isinstance(current, BaseModel) else
                           [v.model_dump() if isinstance(v, BaseModel) else v for v in current]
                           if isinstance(current, list) else current)
        kind = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {kind} | `{shown}` | {effect_of(section, name)} | "
                    f"{_described(prefix + name, comments or {})} |")
    return rows


def render(params_text: str | None = None) -> str:
    comments = params_comments(PARAMS.read_text() if params_text is None and PARAMS.exists() else params_text or "")
    lines = [HEADER]
    cfg = Config()
    for name, field in Config.model_fields.items():
        ann = field.annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            continue
        lines += [f"## `{name}`", "", "| setting | type | default | changes | what it does |", "|---|---|---|---|---|",
                  *_rows(ann, getattr(cfg, name), f"{name}.", comments), ""]
    top = [n for n, f in Config.model_fields.items()
           if not (isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))]
    lines += ["## top level", "", "| setting | type | default | changes | what it does |", "|---|---|---|---|---|",
              *[f"| `{n}` | {Config.model_fields[n].annotation.__name__} | `{json.dumps(getattr(cfg, n))}` | "
                f"{effect_of(Config, n)} | {_described(n, comments)} |" for n in top], ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
