"""Every command in the README, CONTRIBUTING.md and docs/ runs as written: a `make` target exists in the
Makefile, a `protege` command line parses against the CLI (its subcommands, options and arguments, without
running it), the commands that only read (`plan`, `study --dry-run`) run, and a path handed to pytest exists."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from protege.cli import app

try:  # typer >= 0.19 carries its own copy of click: its commands and usage errors are that copy's classes
    from typer._click.exceptions import UsageError
except ImportError:  # older typer: click itself
    from click.exceptions import UsageError

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every command line in a bash block, its trailing comment removed."""
    out = []
    for page in PAGES:
        for block in SHELL_BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                command = line.split(" #", 1)[0].strip()
                if command and not command.startswith("#"):
                    out.append((page.relative_to(REPO).as_posix(), command))
    return out


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M))


def parse_protege(argv: list[str]) -> tuple[list[str], object]:
    """Parse argv as `protege ARGV` would, down to the leaf command; return the command path and its
    context. Raises UsageError for an unknown command, option or a missing argument."""
    root = typer.main.get_command(app)
    ctx = root.make_context("protege", list(argv))
    command, path = root, []
    while hasattr(command, "resolve_command"):  # a group: descend to the named command
        name, sub, rest = command.resolve_command(ctx, ctx._protected_args + ctx.args)
        path.append(name)
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return path, ctx


COMMANDS = documented_commands()


def test_the_pages_document_commands():
    pages = {page for page, _ in COMMANDS}
    assert {"README.md", "CONTRIBUTING.md"} <= pages
    assert sum(1 for _, c in COMMANDS if "protege " in c) >= 10


@pytest.mark.parametrize("page,command", [c for c in COMMANDS if c[1].startswith("make ")])
def test_make_targets_exist(page, command):
    target = shlex.split(command)[1]
    assert target in make_targets(), f"{page}: `{command}`: no target {target!r} in the Makefile"


@pytest.mark.parametrize("page,command", [c for c in COMMANDS if " -m pytest " in c[1]])
def test_pytest_paths_exist(page, command):
    paths = [a for a in shlex.split(command) if a.startswith("tests/")]
    assert paths, f"{page}: `{command}` names no test path"
    for p in paths:
        assert (REPO / p.split("::")[0]).exists(), f"{page}: `{command}`: {p} does not exist"


def _protege_argv(command: str) -> list[str] | None:
    words = shlex.split(command)
    if not words or Path(words[0]).name != "protege":
        return None
    return words[1:]


PROTEGE = [(page, c) for page, c in COMMANDS if _protege_argv(c) is not None]


@pytest.mark.parametrize("page,command", PROTEGE)
def test_protege_commands_parse(page, command):
    try:
        path, _ = parse_protege(_protege_argv(command))
    except UsageError as exc:
        pytest.fail(f"{page}: `{command}` does not parse: {exc.format_message()}")
    help_text = CliRunner().invoke(app, [*path, "--help"])
    assert help_text.exit_code == 0, f"{page}: `protege {' '.join(path)} --help` failed: {help_text.output}"


def _read_only(argv: list[str]) -> bool:
    return argv[0] == "plan" or (argv[0] == "study" and "--dry-run" in argv)


@pytest.mark.parametrize("page,command", [(p, c) for p, c in PROTEGE if _read_only(_protege_argv(c))])
def test_read_only_commands_run(page, command, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = _protege_argv(command)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, f"{page}: `{command}` exited {result.exit_code}: {result.output[-2000:]}"
    if argv[0] == "study":  # the queue's expected time comes before anything runs
        assert "run(s) to do" in result.output and "at a time" in result.output, result.output[-500:]


def test_the_parser_refuses_what_the_cli_lacks():
    with pytest.raises(UsageError):
        parse_protege(["eval", "scor"])
    with pytest.raises(UsageError):
        parse_protege(["plan", "--no-such-option"])
    assert "no-such-target" not in make_targets() and "demo" in make_targets()


def test_the_documented_memory_tables_are_the_plans_output(monkeypatch):
    """Every `protege plan` command on docs/own-model.md: each table it prints (the device's, the host's) and
    its job variables are on the page as printed."""
    monkeypatch.chdir(REPO)
    page = (REPO / "docs/own-model.md").read_text()
    commands = [c for p, c in PROTEGE if p == "docs/own-model.md" and _protege_argv(c)[0] == "plan"]
    assert commands
    for command in commands:
        printed = CliRunner().invoke(app, _protege_argv(command)).output
        kept = "\n".join(line if line.startswith(("|", "job variables")) else "" for line in printed.splitlines())
        blocks = [b.strip() for b in kept.split("\n\n") if b.strip()]
        assert blocks, printed
        for block in blocks:
            assert block in page, f"docs/own-model.md's table for `{command}` is not `protege plan`'s:\n{block}"
