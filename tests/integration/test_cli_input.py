"""The command line and bad input: every refusal is an ``error:`` line
(and a ``hint:``) with exit status 2, never a traceback, and changes nothing; ``runs show
--json`` says what the run waits for; a resend after the run ended is a no-op."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

import cli
from outbox import migrate, registry, writer
from tests.helpers import TENANT, new_run, turn
from tests.relay_harness import scalar


@pytest.fixture
def run_cli(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(cli.main, list(args), input=input)

    return invoke


def refused(result: Result, status: int = 2) -> str:
    """The ``error:`` line of a refusal; fails on a traceback or another exit status."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == status, result.output
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), result.output
    assert all(line.startswith(("error: ", "hint: ")) for line in lines), result.stderr
    return lines[0]


@pytest.fixture
def waiting_run(db_url) -> writer.RunRef:
    """A run in requires_action, waiting for the output of client call c1."""
    with psycopg.connect(db_url) as conn:
        registry.register(conn, registry.ToolSpec(name="approve", executor="client"))
        run = new_run(conn, tools=["approve"])
        writer.record_model_turn(conn, turn(run, 1, ("c1", "approve", {"amount": 5})))
        conn.commit()
    return run


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CREATE = ["runs", "create", "--tenant", TENANT, "--message", "hi", "--model", "m"]


def test_malformed_ids_are_refused(run_cli):
    assert "not-a-uuid" in refused(run_cli(*CREATE, "--thread", "not-a-uuid"))
    assert "not-a-uuid" in refused(run_cli("threads", "show", "not-a-uuid", "--tenant", "a"))


def test_files_that_are_not_json_are_refused(run_cli, tmp_path, waiting_run, db_url):
    bad = write(tmp_path, "bad.json", "{not json")
    assert "bad.json" in refused(run_cli("runs", "submit-outputs", str(waiting_run.id), bad))
    assert "bad.json" in refused(run_cli("threads", "import", bad, "--tenant", TENANT))
    assert scalar(db_url, "SELECT count(*) FROM outbox.threads") == 1
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 0


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[{"tool_call_id": "c1", "output": "a\\u0000b"}]', "NUL character (\\u0000) at $[0]"),
        ('[{"tool_call_id": "c1", "output": NaN}]', "it holds NaN"),
        ("[" * 100_000 + "]" * 100_000, "nested more than 128 levels deep"),
    ],
)
def test_files_postgresql_cannot_store_are_refused_naming_why(
    run_cli, tmp_path, waiting_run, db_url, text, says
):
    path = write(tmp_path, "outputs.json", text)
    line = refused(run_cli("runs", "submit-outputs", str(waiting_run.id), path))
    assert "outputs.json is not storable JSON: " in line and says in line
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 0


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--endpoint", "http://127.0.0.1:9/t", "--schema", "{not json"], "--schema"),
        (["--endpoint", "http://127.0.0.1:9/t", "--schema", '{"type": 12}'], "JSON Schema"),
        (["--endpoint", "http://127.0.0.1:9/t", "--schema", "@/nonexistent.json"], "--schema"),
        (["--endpoint", "not-a-url"], "not-a-url"),
        (["--endpoint", "ftp://example.com/t"], "ftp://example.com/t"),
        (
            ["--endpoint", "http://a/t", "--idempotency", "lookup", "--lookup-endpoint", "x"],
            "'x'",
        ),
    ],
)
def test_a_tool_that_cannot_be_registered_is_refused(run_cli, db_url, options, says):
    line = refused(run_cli("tools", "register", "t", *options))
    assert says in line
    assert "validation error" not in line and "pydantic" not in line
    assert scalar(db_url, "SELECT count(*) FROM outbox.tools") == 0


def test_outputs_must_be_a_list(run_cli, tmp_path, waiting_run, db_url):
    obj = write(tmp_path, "obj.json", json.dumps({"tool_call_id": "c1", "output": 1}))
    line = refused(run_cli("runs", "submit-outputs", str(waiting_run.id), obj))
    assert "list" in line
    assert scalar(db_url, "SELECT count(*) FROM outbox.tool_results") == 0


def test_a_base_url_that_is_not_a_url_is_refused(run_cli, db_url):
    thread = run_cli("threads", "create", "--tenant", TENANT).output.strip()
    refused(run_cli(*CREATE, "--thread", thread, "--base-url", "not-a-url"))
    assert scalar(db_url, "SELECT count(*) FROM outbox.runs") == 0


def test_a_key_reused_for_another_message_is_refused(run_cli, db_url):
    thread = run_cli("threads", "create", "--tenant", TENANT).output.strip()
    key = ["--thread", thread, "--idempotency-key", "k1"]
    assert run_cli(*CREATE, *key).exit_code == 0
    line = refused(run_cli(*CREATE[:-4], "--message", "other", "--model", "m", *key))
    assert "k1" in line and "message" in line
    assert scalar(db_url, "SELECT count(*) FROM outbox.messages") == 1


def test_runs_show_json_lists_the_calls_the_run_waits_for(run_cli, waiting_run):
    shown = json.loads(run_cli("runs", "show", str(waiting_run.id), "--json").output)
    waiting = shown["pending_client_calls"]
    assert [(c["tool_call_id"], c["tool_name"]) for c in waiting] == [("c1", "approve")]
    assert json.loads(waiting[0]["arguments_raw"]) == {"amount": 5}


def test_outputs_sent_again_after_the_run_completed_change_nothing(
    run_cli, tmp_path, waiting_run, db_url
):
    good = write(tmp_path, "good.json", json.dumps([{"tool_call_id": "c1", "output": "ok"}]))
    assert run_cli("runs", "submit-outputs", str(waiting_run.id), good).exit_code == 0
    with psycopg.connect(db_url) as conn:
        batch = conn.execute("SELECT id FROM outbox.tool_batches").fetchone()[0]
        writer.deliver_batch(conn, batch)
        writer.record_model_turn(conn, turn(waiting_run, 2, text="done"))
        conn.commit()
    assert scalar(db_url, "SELECT status FROM outbox.runs") == "completed"
    journal = scalar(db_url, "SELECT count(*) FROM outbox.journal")
    again = run_cli("runs", "submit-outputs", str(waiting_run.id), good)
    assert again.exit_code == 0 and "completed" in again.output
    assert scalar(db_url, "SELECT count(*) FROM outbox.orphaned_results") == 0
    assert scalar(db_url, "SELECT count(*) FROM outbox.journal") == journal


def test_usage_errors_are_error_lines_too(run_cli):
    assert "--thread" in refused(run_cli(*CREATE))  # a required option is missing
    assert refused(run_cli("runs", "show", str(uuid.uuid4())))  # no such run
    assert "Usage" in run_cli("runs").output  # a group alone still prints its help


def test_commands_that_migrate_start_relays_or_the_demo_refuse_bad_input(
    run_cli, db_url, monkeypatch
):
    assert "nonsense" in refused(run_cli("db", "upgrade", "nonsense"))
    assert "nonsense" in refused(run_cli("db", "downgrade", "nonsense"))
    assert "nope" in refused(run_cli("relay", "--kind", "nope"))
    assert "--database-url" in refused(run_cli("demo", "--database-url", "not-a-url"), 78)
    head = migrate.head_revision()
    assert scalar(db_url, "SELECT version_num FROM outbox.alembic_version") == head
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "not-a-url")
    assert "OUTBOX_DATABASE_URL" in refused(run_cli("runs", "list"), 78)


def test_a_database_that_does_not_answer_is_75_and_settings_that_do_not_fit_are_78(
    run_cli, db_url, monkeypatch
):
    """A script or a process manager tells "try again later" from "fix the settings"."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql://outbox@127.0.0.1:1/outbox")
    assert "cannot connect" in refused(run_cli("runs", "list"), status=75)
    missing = psycopg.conninfo.make_conninfo(db_url, dbname=f"no_such_{uuid.uuid4().hex}")
    monkeypatch.setenv("OUTBOX_DATABASE_URL", missing)
    assert "does not exist" in refused(run_cli("runs", "list"), status=78)
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    monkeypatch.setenv("OUTBOX_SCHEMA", "no_outbox_here")
    assert "no outbox tables" in refused(run_cli("runs", "list"), status=78)
