"""The agent-loop CLI against a real database: threads create/show/import, runs create/
cancel/submit-outputs (happy paths, bad input, refused transitions)."""

from __future__ import annotations

import json

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import registry
from tests.relay_harness import scalar


@pytest.fixture
def run_cli(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(cli.main, list(args), input=input, catch_exceptions=False)

    return invoke


def test_thread_run_cancel_and_show(db_url, run_cli):
    thread = run_cli("threads", "create", "--tenant", "acme", "--system", "be brief").output
    thread = thread.strip()
    created = run_cli(
        "runs",
        "create",
        "--thread",
        thread,
        "--tenant",
        "acme",
        "--message",
        "hi",
        "--model",
        "m",
        "--idempotency-key",
        "k1",
        "--json",
    )
    assert created.exit_code == 0, created.output
    run_id = json.loads(created.output)["id"]
    again = run_cli(
        "runs",
        "create",
        "--thread",
        thread,
        "--tenant",
        "acme",
        "--message",
        "hi",
        "--model",
        "m",
        "--idempotency-key",
        "k1",
    )
    assert again.output.startswith("existing run")
    other = run_cli(
        "runs",
        "create",
        "--thread",
        thread,
        "--tenant",
        "acme",
        "--message",
        "other",
        "--model",
        "m",
    )
    assert other.exit_code == 2 and "already has active run" in other.output
    assert run_cli("runs", "cancel", run_id[:8]).exit_code == 0
    refused = run_cli("runs", "cancel", run_id)
    assert refused.exit_code == 2 and "already cancelled" in refused.output
    shown = json.loads(run_cli("threads", "show", thread, "--tenant", "acme").output)
    assert [m["role"] for m in shown] == ["system", "user"]
    assert scalar(db_url, "SELECT status FROM outbox.runs") == "cancelled"


def test_submit_outputs_from_a_file(db_url, run_cli, tmp_path):
    from outbox import writer
    from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

    with psycopg.connect(db_url) as conn:
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        thread = writer.create_thread(conn, "acme")
        run = writer.start_run(
            conn, StartRun(tenant_id="acme", thread_id=thread.id, model="m", tools=["approve"])
        )
        writer.record_model_turn(
            conn,
            ModelTurnIn(
                tenant_id="acme",
                run_id=run.id,
                step_no=1,
                tool_calls=[ToolCallIn(tool_call_id="c1", name="approve", arguments="{}")],
            ),
        )
        conn.commit()
    waiting = run_cli("runs", "show", str(run.id))
    assert "waiting for client outputs" in waiting.output and "c1" in waiting.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"tool_call_id": "nope", "output": 1}]))
    refused = run_cli("runs", "submit-outputs", str(run.id), str(bad))
    assert refused.exit_code == 2 and "are not calls of run" in refused.output
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"tool_call_id": "c1", "output": {"ok": True}}]))
    assert "in_progress" in run_cli("runs", "submit-outputs", str(run.id), str(good)).output
    assert run_cli("runs", "submit-outputs", str(run.id), str(good)).exit_code == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 1


def test_import_repairs_and_reports(db_url, run_cli, tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
    path = tmp_path / "conv.json"
    path.write_text(
        json.dumps(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "zz", "content": "orphan"},
            ]
        )
    )
    result = run_cli("threads", "import", str(path), "--tenant", "acme")
    assert result.exit_code == 0
    assert "dropped 1 orphan results, closed 1 unanswered calls" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"role": "robot", "content": "x"}]))
    refused = run_cli("threads", "import", str(bad), "--tenant", "acme")
    assert refused.exit_code == 2 and "role 'robot'" in refused.output
