"""``outbox queue holders``: who holds a transaction open on the outbox's tables, and how many
wait on it (docs/operations.md, "Transactions left open on the outbox's rows").

A session of the test locks a run and stays idle in its transaction, as an application's
leaked session does; another waits to lock the same run. The command names the holder (its
pid, application, tables, the sessions waiting on it), leaves a fresh transaction nobody
waits on out until it is older than ``--older-than``, and tells a user who may not read
other roles' sessions how many it cannot show, rather than showing nothing.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cli
from tests.helpers import blocked_on_a_lock, new_run
from tests.relay_harness import wait_until


def holders(db_url: str, *args: str) -> dict[str, Any]:
    done = CliRunner().invoke(
        cli.main,
        ["queue", "holders", *args, "--json"],
        env={"OUTBOX_DATABASE_URL": db_url},
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output
    return dict(json.loads(done.output))


@pytest.fixture
def held(db_url: str) -> Iterator[tuple[psycopg.Connection[Any], Any]]:
    """A session, named like an application, idle in a transaction that locked a run."""
    with psycopg.connect(db_url) as conn:
        run = new_run(conn)
        conn.commit()
    with psycopg.connect(db_url, application_name="billing-worker") as conn:
        conn.execute("SELECT 1 FROM outbox.runs WHERE id = %s FOR UPDATE", [run.id])
        yield conn, run.id
        conn.rollback()


def test_the_holder_of_a_run_is_named_with_those_waiting_on_it(db_url, held):
    conn, run = held
    assert holders(db_url)["sessions"] == []  # fresh, and nobody waits on it
    [fresh] = holders(db_url, "--older-than", "0s")["sessions"]
    assert (fresh["pid"], fresh["state"]) == (conn.info.backend_pid, "idle in transaction")

    def a_writer_of_the_same_run() -> None:
        with psycopg.connect(db_url) as other:
            other.execute("SELECT 1 FROM outbox.runs WHERE id = %s FOR UPDATE", [run])

    writer = threading.Thread(target=a_writer_of_the_same_run)
    writer.start()
    try:
        wait_until(lambda: blocked_on_a_lock(db_url), what="the writer to wait on the holder")
        [holder] = holders(db_url)["sessions"]  # listed now: another waits on it
        assert holder["pid"] == conn.info.backend_pid
        assert holder["application_name"] == "billing-worker"
        assert holder["waiting"] == 1 and "runs" in holder["tables"]
        assert "FOR UPDATE" in holder["last_query"]
    finally:
        conn.rollback()  # the holder lets go: the writer gets the run
        writer.join(timeout=30)
    assert not writer.is_alive()
    assert holders(db_url, "--older-than", "0s")["sessions"] == []


def test_a_transaction_that_only_reads_holds_nothing_back(db_url):
    """A reader's transaction (a report, a pg_dump) takes no row's lock: not listed."""
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM outbox.runs")
        assert holders(db_url, "--older-than", "0s")["sessions"] == []
        reader.execute("SELECT 1 FROM outbox.runs FOR UPDATE")  # now it would hold rows
        [holder] = holders(db_url, "--older-than", "0s")["sessions"]
        assert holder["pid"] == reader.info.backend_pid


@pytest.mark.usefixtures("held")
def test_a_user_who_may_not_read_other_sessions_is_told_how_many_are_hidden(db_url):
    login = f"ops_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {login} LOGIN")
    try:
        url = psycopg.conninfo.make_conninfo(db_url, user=login)
        found = holders(url, "--older-than", "0s")
        assert (found["sessions"], found["hidden"]) == ([], 1)
        done = CliRunner().invoke(cli.main, ["queue", "holders"], env={"OUTBOX_DATABASE_URL": url})
        assert done.exit_code == 0, done.output
        assert "1 session(s) of other roles" in done.output
        assert "pg_read_all_stats" in done.output
    finally:
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {login}")
