"""The markdown every study report shares (a qa study's, a game study's, and the results table of a study
file): a claim's verdict cell and the preconditions section. Kept apart from protege.study.report so that the
game report and the results table need not import it (nor it them)."""
from __future__ import annotations

from pathlib import Path

from protege.study import preconditions as pre
from protege.study.curves import figure_path


def verdict_cell(c: dict, evaluated: list[dict]) -> str:
    """**verdict**, or **precondition not met** with what the unmet precondition measured."""
    if c["verdict"] == pre.PRECONDITION_NOT_MET:
        return f"**{c['verdict']}** ({pre.unmet_detail(c, evaluated)})"
    return f"**{c['verdict']}**" + (" (the opposite holds)" if c["verdict"] == "not reproduced" else "")


def preconditions_section(report: dict, figures: dict[str, str] | None = None, level: str = "##") -> list[str]:
    """The preconditions table and the training curves' pictures (`figures`: figure -> its file, relative to
    the markdown; by default the part report's own, beside it)."""
    lines = []
    if report.get("preconditions"):
        lines += ["", f"{level} Preconditions", "",
                  "Measured on each finished seed of the variant before any claim that requires them is judged; a "
                  "claim whose preconditions are not met says so instead of a verdict.", "",
                  *pre.markdown_table(report["preconditions"])]
    if figures is None:
        figures = {key: figure_path(Path(f"{report['study']}.md"), key).name for key in report.get("figures", [])}
    for key, name in figures.items():
        lines += ["", f"![{key} curves of `{report['study']}`]({name})"]
    return lines
