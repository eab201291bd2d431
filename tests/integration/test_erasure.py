"""Erasure of a thread's content: no trace of it left in any table (the archive included,
and a result that arrives after the erasure), while ids, statuses, counts, digests and the
journal stay for audits; a run in flight is cancelled first.

A canary string goes into the user's message, the model's text, the tool's arguments and
the tool's result; after the erasure it is searched for in every row of every table.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

import cli
from outbox import retention, writer
from outbox.errors import OutboxError
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

TENANT = "acme"
CANARY = "canary-7f3a-private"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
ECHO = {"name": "echo", "arguments": {"note": CANARY}}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(
        scripts={"echo": [{"tool_calls": [ECHO]}, {"text": f"you said {CANARY}"}]}
    ) as server:
        yield server


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        svc.add_tool("echo", "key", lambda arguments, _effect: {"echo": arguments})
        yield svc


@pytest.fixture
def setup(db_url: str, service: FakeToolService) -> str:
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "echo", "key", timeout_s=30.0)
        conn.commit()
    return db_url


def start(db_url: str, model: ScriptedModel) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT, title=f"about {CANARY}").id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread,
                model="scripted-1",
                message=f"script:echo remember {CANARY}",
                tools=["echo"],
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
    return run


def status(db_url: str, run_id: uuid.UUID) -> str:
    return str(scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id]))


def tables_holding(db_url: str, text: str) -> list[str]:
    """Every table of the schema (archive partitions included) with a row containing
    ``text``."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            ).fetchall()
        ]
        return [
            name
            for name in names
            if conn.execute(
                f"SELECT count(*) FROM outbox.{name} t WHERE t::text LIKE %s", [f"%{text}%"]
            ).fetchone()[0]  # type: ignore[index]
        ]


def counts(db_url: str, thread_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return {
            "messages": conn.execute(
                "SELECT count(*) FROM outbox.messages WHERE thread_id = %s", [thread_id]
            ).fetchone(),
            "calls": conn.execute(
                "SELECT count(*), array_agg(arguments_hash), array_agg(status) "
                "FROM outbox.tool_calls WHERE thread_id = %s",
                [thread_id],
            ).fetchone(),
            "results": conn.execute(
                "SELECT count(*), array_agg(r.status) FROM outbox.tool_results r "
                "JOIN outbox.runs u ON u.id = r.run_id WHERE u.thread_id = %s",
                [thread_id],
            ).fetchone(),
            "run": conn.execute(
                "SELECT status, step_count, tokens_used FROM outbox.runs WHERE thread_id = %s",
                [thread_id],
            ).fetchall(),
        }


def reasoned(conn: psycopg.Connection, thread_id: object) -> None:
    """The model's answer carries a reasoning item (content too: erasure removes it)."""
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": CANARY}
    conn.execute(
        "UPDATE outbox.messages SET reasoning = %s WHERE thread_id = %s AND role = 'assistant'",
        [Jsonb([item]), thread_id],
    )
    conn.commit()


def test_erasure_removes_the_content_and_keeps_what_audits_need(setup, model, conn):
    run = start(setup, model)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: status(setup, run.id) == "completed", what="the run to complete")
    reasoned(conn, run.thread_id)
    assert set(tables_holding(setup, CANARY)) >= {"threads", "messages", "tool_calls"}
    kept = counts(setup, run.thread_id)

    detail = retention.erase_thread(conn, run.thread_id, actor="dpo@acme")
    conn.commit()

    assert tables_holding(setup, CANARY) == []
    assert counts(setup, run.thread_id) == kept
    assert detail["cancelled_runs"] == [] and detail["tool_calls"] == 1
    event = conn.execute(
        "SELECT tenant_id, actor, detail FROM outbox.journal "
        "WHERE event = 'thread.erased' AND thread_id = %s",
        [run.thread_id],
    ).fetchone()
    assert event == (TENANT, "dpo@acme", detail)
    assert scalar(
        setup, "SELECT erased_at IS NOT NULL FROM outbox.threads WHERE id = %s", [run.thread_id]
    )
    conn.commit()
    with pytest.raises(OutboxError, match="deleted"):
        writer.start_run(
            conn,
            StartRun(tenant_id=TENANT, thread_id=run.thread_id, model="m", message="again"),
        )
    conn.rollback()
    # The audit views still count what happened.
    assert (
        scalar(
            setup,
            "SELECT calls FROM outbox.tool_stats WHERE tool_name = 'echo' AND tenant_id = %s",
            [TENANT],
        )
        == 1
    )


def test_erasure_racing_a_call_in_flight_leaves_no_content_behind(setup, model, service, conn):
    service.tool("echo").latency(3.0, n=1)  # the call is still running when the thread goes
    run = start(setup, model)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(
            lambda: scalar(
                setup,
                "SELECT count(*) FROM outbox.tool_calls WHERE run_id = %s "
                "AND dispatched_attempt IS NOT NULL",
                [run.id],
            ),
            what="the call to be dispatched",
        )
        detail = retention.erase_thread(conn, run.thread_id, actor="dpo@acme")
        conn.commit()
        assert detail["cancelled_runs"] == [str(run.id)]
        assert status(setup, run.id) == "cancelled"
        wait_until(
            lambda: scalar(
                setup, "SELECT count(*) FROM outbox.orphaned_results WHERE run_id = %s", [run.id]
            ),
            what="the late result to arrive",
        )
    assert service.tool("echo").to_json()["effects"], "the call was not running"
    assert tables_holding(setup, CANARY) == []


def test_an_archived_conversation_is_erased_in_the_archive(setup, model, conn):
    run = start(setup, model)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: status(setup, run.id) == "completed", what="the run to complete")
    reasoned(conn, run.thread_id)
    retention.set_policy(conn, "*", timedelta(hours=1), mode="archive", actor="ops")
    conn.execute(
        "UPDATE outbox.threads SET created_at = created_at - interval '2 hours' WHERE id = %s",
        [run.thread_id],
    )
    conn.execute(
        "UPDATE outbox.runs SET ended_at = ended_at - interval '2 hours' WHERE id = %s", [run.id]
    )
    conn.execute(
        "UPDATE outbox.messages SET created_at = created_at - interval '2 hours' "
        "WHERE thread_id = %s",
        [run.thread_id],
    )
    conn.commit()
    assert retention.run(conn, actor="ops").threads == 1
    assert tables_holding(setup, CANARY) == ["archived_runs"]
    # The thread has left the hot tables: the erasure reaches it in the archive.
    result = CliRunner().invoke(
        cli.main,
        ["threads", "erase", str(run.thread_id), "--actor", "dpo", "--json"],
        env={"OUTBOX_DATABASE_URL": setup},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["archived_documents"] == 2
    assert tables_holding(setup, CANARY) == []
    # The archived timeline still answers (the journal holds no content).
    assert scalar(setup, "SELECT count(*) FROM outbox.run_timeline WHERE run_id = %s", [run.id])
