"""The CLI stays a set of modules one can live in: ``commands/main.py`` assembles the
command groups, each group is a module of ``commands/``, and none of them grows past
``MAX_LINES``.

Read from the source, no database: each module also opens with its docstring, a command
imports only its own group's module (``outbox --help`` none), and no command module imports
``cli``, the checkout's entry point over them (import-linter cannot
see ``cli``, a module outside any package, so this test keeps that circle out).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.relay_harness import REPO

MAX_LINES = 500
MODULES = [REPO / "cli.py", *sorted((REPO / "commands").glob("*.py"))]


def name(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_no_cli_module_is_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name(path)} has {lines} lines: split a group out of it"


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_each_cli_module_opens_with_a_docstring(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{name(path)} has no docstring"


@pytest.mark.parametrize("path", MODULES[1:], ids=name)
def test_no_command_module_imports_the_entry_point(path: Path) -> None:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "cli" not in imported, f"{name(path)} imports cli, which imports it"


def test_every_command_module_is_added_to_the_entry_point() -> None:
    from outbox.commands.main import COMMANDS

    added = {f"outbox.commands.{entry.module}" for entry in COMMANDS.values()}
    modules = {f"outbox.commands.{p.stem}" for p in MODULES[1:]}
    not_groups = {"__init__", "__main__", "common", "main"}
    assert modules - {f"outbox.commands.{name}" for name in not_groups} == added


def test_each_listed_command_is_the_one_its_module_defines_with_the_help_listed() -> None:
    """``outbox --help`` lists the commands from ``COMMANDS`` without importing them: each
    entry names its command, and its help reads as the command's own at every width."""
    import click

    from outbox.commands.main import COMMANDS, main

    ctx = click.Context(main, info_name="outbox")
    for name, entry in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name
        assert command.callback is not None
        assert command.callback.__module__ == f"outbox.commands.{entry.module}"
        stand_in = click.Command(name, help=entry.short_help)
        for limit in range(10, 121):
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), (
                f"COMMANDS[{name!r}].short_help is not the first sentence of its help"
            )


IMPORTED = """
import sys
from outbox.commands.main import main
try:
    main(sys.argv[1:], prog_name="outbox")
except SystemExit:
    pass
print(" ".join(sorted(m for m in sys.modules if m.startswith("outbox.commands."))))
"""


@pytest.mark.parametrize(
    ("args", "groups"),
    [
        (["--help"], set()),
        (["--version"], set()),
        (["relay", "--help"], {"relay"}),
        (["requeue", "--help"], {"queue"}),
    ],
    ids=" ".join,
)
def test_a_command_imports_only_its_own_group(args: list[str], groups: set[str]) -> None:
    """A relay process, or any one command, does not pay for importing every group."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, *args], capture_output=True, text=True, check=True
    )
    imported = set(done.stdout.splitlines()[-1].split())
    expected = {"outbox.commands.common", "outbox.commands.main"}
    assert imported == expected | {f"outbox.commands.{g}" for g in groups}
