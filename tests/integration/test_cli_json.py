"""Every CLI command that prints has --json, and what it prints then is JSON.

The commands that had no --json (tools register/enable/disable, threads create/import/show,
runs cancel, runs submit-outputs, tenants budget) are run with it against a real database
and their output must parse as JSON with the fields a script needs. Then the command tree
is walked: every command but ``relay`` and ``serve`` (they run until stopped and log JSON
lines) has --json, so a command added later cannot forget it; the ``db`` commands and
``credentials new-key``, which had none, print JSON.
"""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

import cli
from outbox import db, migrate, writer
from tests.helpers import new_run, turn


@pytest.fixture
def run_json(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        done = runner.invoke(cli.main, [*args, "--json"], input=input, catch_exceptions=False)
        assert done.exit_code == 0, done.output
        return json.loads(done.output)

    return invoke


def test_commands_print_json(run_json, conn, tmp_path):
    tool = run_json("tools", "register", "approve", "--executor", "client")
    assert (tool["name"], tool["version"], tool["executor"]) == ("approve", 1, "client")
    assert run_json("tools", "disable", "approve")["enabled"] is False
    assert run_json("tools", "enable", "approve")["enabled"] is True

    thread = run_json("threads", "create", "--tenant", "acme")["id"]
    assert run_json("threads", "show", thread, "--tenant", "acme") == []
    imported = tmp_path / "conversation.json"
    imported.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    assert run_json("threads", "import", str(imported), "--tenant", "acme")["messages"] == 1

    run = run_json(
        "runs", "create", "--thread", thread, "--tenant", "acme", "--message", "hi",
        "--model", "m",
    )["id"]  # fmt: skip
    assert run_json("runs", "cancel", run) == {"id": run, "status": "cancelled"}

    waiting = new_run(conn, tenant="acme", tools=["approve"])
    writer.record_model_turn(conn, turn(waiting, 1, ("call_1", "approve", {})))
    conn.commit()
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps([{"tool_call_id": "call_1", "output": {"ok": True}}]))
    submitted = run_json("runs", "submit-outputs", str(waiting.id), str(outputs))
    assert submitted == {"id": str(waiting.id), "status": "in_progress"}

    budget = run_json("tenants", "budget", "acme", "--max-tokens", "1000")
    assert (budget["tenant_id"], budget["max_tokens"]) == ("acme", 1000)


# Commands that run until stopped and log JSON lines on stderr: nothing to print as JSON.
RUNS_UNTIL_STOPPED = {"relay", "serve", "traces export"}


def leaf_commands() -> list[tuple[str, ...]]:
    def walk(command: click.Command, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            subs = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
            return [p for name, sub in subs if sub for p in walk(sub, (*path, name))]
        return [path]

    return [p for p in walk(cli.main, ()) if " ".join(p) not in RUNS_UNTIL_STOPPED]


@pytest.mark.parametrize("path", leaf_commands(), ids=" ".join)
def test_every_command_that_prints_has_json(path):
    done = CliRunner().invoke(cli.main, [*path, "--help"])
    assert done.exit_code == 0, done.output
    assert "--json" in done.output, f"`outbox {' '.join(path)}` has no --json"


def test_db_commands_print_json(run_json, db_url):
    head = migrate.head_revision()
    assert run_json("db", "current") == {"revision": head, "head": head, "up_to_date": True}
    assert run_json("db", "url") == {"url": db_url}
    status = run_json("db", "status")
    assert (status["source"], status["url"], status["up"]) == (
        "OUTBOX_DATABASE_URL",
        db.redact(db_url),
        True,
    )
    assert status["server_version"]
    upgraded = run_json("db", "upgrade")
    assert (upgraded["schema"], upgraded["revision"]) == ("outbox", head)
    # with OUTBOX_DATABASE_URL set there is nothing to start: that database is used
    assert run_json("db", "start") == {"url": db.redact(db_url), "embedded": False}
    key = run_json("credentials", "new-key")["key"]
    assert len(key) == 44  # a Fernet key: 32 bytes, url-safe base64


def test_db_stop_and_downgrade_print_json(run_json, db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("OUTBOX_HOME", str(tmp_path / "home"))
    stopped = run_json("db", "stop")
    assert stopped == {"stopped": False, "pgdata": str(tmp_path / "home" / "pgdata")}
    previous = migrate.revisions()[-2]
    assert run_json("db", "downgrade", previous) == {"schema": "outbox", "revision": previous}
