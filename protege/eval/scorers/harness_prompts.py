"""The judge prompts of lmms-eval 0.7.3, read from the installed harness rather than copied into ours.

Under protocol `lmms-eval`, a judge must be asked exactly what lmms-eval asks GPT, or the numbers are
not comparable with published ones. We do not ship the harness's prose: each prompt is read from the
source file of the user's lmms-eval installation (parsed, never imported: importing the task modules
starts API clients) and checked against the SHA-256 of the 0.7.3 text, so a different version is an
error instead of a silent change of protocol.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from protege.errors import UserFacingError

LMMS_EVAL_VERSION = "0.7.3"


@dataclass(frozen=True)
class _Source:
    path: str            # inside the lmms_eval package
    name: str            # the assigned variable
    function: str | None  # the function holding the assignment; None for a module-level constant
    sha256: str


_PROMPTS = {
    "mmvet": _Source("tasks/mmvet/utils.py", "MM_VET_PROMPT", None,
                     "4d9b806e960fcd3f25997104017744653443fb17f907aa0712b5efecea78438c"),
    "mmvet_v2": _Source("tasks/mmvetv2/utils.py", "MM_VET_PROMPT", None,
                        "4d9b806e960fcd3f25997104017744653443fb17f907aa0712b5efecea78438c"),
    "mathvista": _Source("tasks/mathvista/mathvista_evals.py", "DEMO_PROMPT", None,
                         "a231722ced09cbd1f3fd16630ab58bf487f12e2f46ea0b26d1f2f6b5c50fb17c"),
    # a str.format template with three slots: question, options, prediction
    "mmbench": _Source("tasks/mmbench/mmbench_evals.py", "tmpl", "build_prompt",
                       "e9d2a64105ded9b6a7bd62b1e8ed076ef26d9ee636dea6ada16630cd5f014324"),
}

_INSTALL = (f"install it with `pip install --no-deps lmms-eval=={LMMS_EVAL_VERSION}` (`make test` does), "
            "or score with protocol 'lenient', which asks the judge with protege's own prompts")


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec("lmms_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _assigned_string(tree: ast.AST, source: _Source) -> str | None:
    scope: ast.AST = tree
    if source.function:
        scope = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == source.function),
                     None)
        if scope is None:
            return None
    for node in ast.walk(scope):
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == source.name for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    return None


@cache
def lmms_eval_prompt(key: str) -> str:
    """lmms-eval 0.7.3's judge prompt for `key` (mmvet, mmvet_v2, mathvista, mmbench); UserFacingError
    when lmms-eval is missing or its text is not 0.7.3's."""
    source = _PROMPTS[key]
    package = _package_dir()
    if package is None:
        raise UserFacingError(f"protocol 'lmms-eval' with a judge asks it lmms-eval {LMMS_EVAL_VERSION}'s own "
                              f"{key} prompt, read from the installed lmms-eval, which is not installed: {_INSTALL}")
    path = package / source.path
    try:
        text = _assigned_string(ast.parse(path.read_text(encoding="utf-8")), source)
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise UserFacingError(f"{path}: cannot read lmms-eval's {key} prompt ({e}); {_INSTALL}") from e
    if text is None or hashlib.sha256(text.encode("utf-8")).hexdigest() != source.sha256:
        raise UserFacingError(f"{path}: the {source.name} prompt is not lmms-eval {LMMS_EVAL_VERSION}'s "
                              f"(protocol 'lmms-eval' follows that version); {_INSTALL}")
    return text
