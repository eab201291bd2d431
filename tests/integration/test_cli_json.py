"""Every CLI command that prints has --json, and what it prints then is JSON.

The commands that had no --json (tools register/enable/disable, threads create/import/show,
runs cancel, runs submit-outputs, tenants budget) are run with it against a real database
and their output must parse as JSON with the fields a script needs.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cli
from outbox import writer
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
