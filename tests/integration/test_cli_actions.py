"""The action layer from the command line: policy, approvals, switches, pauses.

Each command runs against a real database through click, as an operator types it; the
journal must name the actor each one was given.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import cli
from outbox import writer
from tests.helpers import add_tool, new_run, turn


@pytest.fixture
def outbox(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        done = runner.invoke(cli.main, list(args), catch_exceptions=False)
        assert done.exit_code == code, done.output
        return done.output

    return invoke


def journal(conn, event: str) -> list[tuple]:
    return conn.execute(
        "SELECT tenant_id, actor FROM outbox.journal WHERE event = %s ORDER BY id", [event]
    ).fetchall()


def test_policy_approvals_switches_and_pauses(outbox, conn):
    policies = json.loads(outbox("policy", "list", "--json"))
    assert {(p["tenant_id"], p["risk_tier"], p["action"]) for p in policies} == {
        ("*", "low", "allow"),
        ("*", "medium", "allow"),
        ("*", "high", "approve"),
    }
    outbox("policy", "set", "acme", "high", "approve", "--approver", "bob", "--timeout", "2h",
           "--actor", "ops")  # fmt: skip
    rule = next(
        p for p in json.loads(outbox("policy", "list", "--json")) if p["tenant_id"] == "acme"
    )
    assert (rule["approvers"], rule["approval_timeout_s"]) == (["bob"], 7200.0)

    add_tool(conn, "send_email", risk_tier="high")
    run = new_run(conn, tools=["send_email"])
    writer.record_model_turn(conn, turn(run, 1, ("call_1", "send_email", {"order_id": "7"})))
    conn.commit()
    (pending,) = json.loads(outbox("approvals", "list", "--json"))
    assert (pending["tool_name"], pending["approvers"]) == ("send_email", ["bob"])
    (waiting,) = json.loads(outbox("runs", "show", str(run.id), "--json"))["pending_approvals"]
    assert waiting["id"] == pending["id"]
    assert "waiting for a reviewer" in outbox("runs", "show", str(run.id))
    stats = json.loads(outbox("queue", "stats", "--json"))["by_kind"]
    assert [(r["held"], r["delayed"]) for r in stats if r["kind"] == "tool_call"] == [(1, 0)]
    shown = outbox("approvals", "show", str(pending["id"]))
    assert '"order_id": "7"' in shown and pending["arguments_digest"] in shown

    refused = outbox("approvals", "approve", str(pending["id"]), "--actor", "alice", code=2)
    assert "error: alice may not decide" in refused
    outbox("approvals", "deny", str(pending["id"]), "--actor", "bob", "--reason", "no")
    again = outbox("approvals", "approve", str(pending["id"]), "--actor", "bob", code=2)
    assert "already decided: denied by bob" in again
    assert json.loads(outbox("approvals", "list", "--json")) == []
    (denied,) = json.loads(outbox("approvals", "list", "--status", "denied", "--json"))
    assert denied["reason"] == "no"
    assert journal(conn, "approval.denied") == [("acme", "bob")]

    # A shared tool switched off for one tenant (it answered "not registered" before).
    assert "disabled send_email for tenant acme" in outbox(
        "tools", "disable", "send_email", "--tenant", "acme", "--reason", "incident",
        "--actor", "ops",
    )  # fmt: skip
    (switch,) = json.loads(outbox("tools", "switches", "--json"))
    assert (switch["tenant_id"], switch["switched_by"], switch["reason"]) == (
        "acme",
        "ops",
        "incident",
    )
    assert "not registered" in outbox("tools", "disable", "no_such_tool", code=2)
    outbox("tools", "enable", "send_email", "--tenant", "acme", "--actor", "ops")
    assert json.loads(outbox("tools", "switches", "--json")) == []
    assert journal(conn, "tool.disabled") == [("acme", "ops")]
    assert journal(conn, "tool.enabled") == [("acme", "ops")]

    assert "paused tenant acme" in outbox("tenants", "pause", "acme", "--actor", "ops")
    assert [p["tenant_id"] for p in json.loads(outbox("tenants", "paused", "--json"))] == ["acme"]
    assert "resumed tenant acme" in outbox("tenants", "resume", "acme", "--actor", "ops")
    assert "(it was not paused)" in outbox("tenants", "resume", "acme")
    assert journal(conn, "tenant.paused") == [("acme", "ops")]


def test_bad_policy_input_is_a_usage_error(outbox):
    assert "Invalid value" in outbox("policy", "set", "acme", "extreme", "deny", code=2)
    assert "is not an age" in outbox("policy", "set", "acme", "high", "approve", "--timeout",
                                     "soon", code=2)  # fmt: skip
    assert "does not exist" in outbox("approvals", "approve", "999", code=2)
