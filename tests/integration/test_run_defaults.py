"""The defaults of new runs have one source: the database's run_defaults.

``start_run_v1`` wrote its own 20 steps, loop limit 3 and 600 s while the Python writer API
read its process's environment, so a backend on SQL and one on Python made different runs
from the same settings. Here one setting is made, and a run is started each way.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import budgets, writer
from outbox.errors import InvalidInput, NotFound
from tests.helpers import TENANT, new_run


def sql_run(conn: psycopg.Connection[Any]) -> uuid.UUID:
    """A run started the way a backend without Python starts one, naming no defaults."""
    conn.execute("SET LOCAL ROLE outbox_writer")
    thread = conn.execute("SELECT outbox.create_thread_v1(%s)", [TENANT]).fetchone()[0]
    row = conn.execute(
        "SELECT run_id FROM outbox.start_run_v1(%s, %s, 'scripted', p_message => 'hello')",
        [TENANT, thread],
    ).fetchone()
    conn.execute("RESET ROLE")
    return row[0]


def what_it_got(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> tuple[Any, ...]:
    """The run's defaults and its first model turn's attempts."""
    row = conn.execute(
        "SELECT r.max_steps, r.loop_limit, r.action_timeout, o.max_attempts "
        "FROM outbox.runs r JOIN outbox.outbox o ON o.run_id = r.id AND o.kind = 'model_turn' "
        "WHERE r.id = %s",
        [run_id],
    ).fetchone()
    return tuple(row)


def test_the_same_settings_make_the_same_run_from_python_and_from_sql(conn):
    budgets.set_run_defaults(conn, max_steps=7, loop_limit=4, action_timeout_s=90, actor="ops")
    conn.commit()
    from_python = what_it_got(conn, new_run(conn).id)
    from_sql = what_it_got(conn, sql_run(conn))
    assert from_python == from_sql == (7, 4, timedelta(seconds=90), 5)
    # what a caller names still wins, either way
    assert writer.get_run(conn, new_run(conn, max_steps=3, loop_limit=2).id)["max_steps"] == 3


def test_db_upgrade_stores_the_variables_a_deployment_set(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)
    monkeypatch.setenv("OUTBOX_DEFAULT_MAX_STEPS", "12")
    monkeypatch.setenv("OUTBOX_LOOP_LIMIT", "5")
    monkeypatch.setenv("OUTBOX_ACTION_TIMEOUT_S", "45")

    def outbox(*args: str) -> str:
        done = CliRunner().invoke(cli.main, list(args))
        assert done.exit_code == 0, done.output
        return done.output

    said = outbox("db", "upgrade")
    assert "max_steps 12, loop_limit 5, action_timeout_s 45" in said
    assert "from the environment" not in outbox("db", "upgrade")  # stored already: no change
    with psycopg.connect(db_url) as conn:
        expected = (12, 5, timedelta(seconds=45), 5)
        assert what_it_got(conn, new_run(conn).id) == expected
        assert what_it_got(conn, sql_run(conn)) == expected
        events = conn.execute(
            "SELECT actor, detail FROM outbox.journal WHERE event = 'platform.run_defaults_set'"
        ).fetchall()
    assert events == [
        (
            "outbox db upgrade (environment)",
            {"max_steps": 12, "loop_limit": 5, "action_timeout_s": 45.0},
        )
    ]
    monkeypatch.delenv("OUTBOX_DEFAULT_MAX_STEPS")
    monkeypatch.delenv("OUTBOX_LOOP_LIMIT")
    monkeypatch.delenv("OUTBOX_ACTION_TIMEOUT_S")
    assert "max_steps 30, loop_limit 5" in outbox("platform", "defaults", "--max-steps", "30")
    assert "max_steps 30" in outbox("platform", "defaults")


def test_defaults_out_of_range_are_refused(conn, monkeypatch):
    with pytest.raises(InvalidInput, match="max-steps"):
        budgets.set_run_defaults(conn, max_steps=0)
    with pytest.raises(InvalidInput, match="loop-limit"):
        budgets.set_run_defaults(conn, loop_limit=1)
    monkeypatch.setenv("OUTBOX_DEFAULT_MAX_STEPS", "2.5")
    with pytest.raises(InvalidInput, match="OUTBOX_DEFAULT_MAX_STEPS must be a whole number"):
        budgets.apply_environment(conn)


def test_a_missing_row_is_said_and_made_again(conn):
    conn.execute("DELETE FROM outbox.run_defaults")
    thread = writer.create_thread(conn, TENANT)
    conn.commit()
    with pytest.raises(NotFound, match="defaults of new runs are missing"):
        new_run(conn, thread_id=thread.id)
    conn.rollback()
    conn.execute("DELETE FROM outbox.run_defaults")
    budgets.set_run_defaults(conn, loop_limit=6)
    assert what_it_got(conn, new_run(conn).id)[:2] == (20, 6)
