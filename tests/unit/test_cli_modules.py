"""The CLI stays a set of modules one can live in: ``commands/main.py`` assembles the
command groups, each group is a module of ``commands/``, and none of them grows past
``MAX_LINES``.

Read from the source, no database: each module also opens with its docstring, and no
command module imports ``cli``, the checkout's entry point over them (import-linter cannot
see ``cli``, a module outside any package, so this test keeps that circle out).
"""

from __future__ import annotations

import ast
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
    from outbox.commands.main import main

    added = {command.callback.__module__ for command in main.commands.values()}
    modules = {f"outbox.commands.{p.stem}" for p in MODULES[1:]}
    not_groups = {"__init__", "__main__", "common", "main"}
    assert modules - {f"outbox.commands.{name}" for name in not_groups} == added
