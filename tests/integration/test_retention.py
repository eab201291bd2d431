"""Retention by policy: idle conversations leave the hot tables whole, archived or deleted;
nothing active, waiting or locked is touched; the journal stays append-only but for the
runs retention removed; the audit views still answer for archived runs.

Conversations are aged by moving their timestamps back (the owner may), never by waiting.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import cli
from outbox import history, lifecycle, ops, registry, retention, writer
from outbox.errors import OutboxError
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import new_run, turn
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

TENANT = "acme"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
TICKET = {"name": "create_ticket", "arguments": {"title": "broken order"}}
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "sorry"}}
HOUR = timedelta(hours=1)

# Every table that holds a conversation's rows, and how to find a thread's rows in it.
UNDER_THREAD = {
    "threads": "id = %(t)s",
    "runs": "thread_id = %(t)s",
    "messages": "thread_id = %(t)s",
    "model_turns": "run_id = ANY(%(r)s)",
    "tool_batches": "run_id = ANY(%(r)s)",
    "tool_calls": "run_id = ANY(%(r)s)",
    "tool_results": "run_id = ANY(%(r)s)",
    "orphaned_results": "run_id = ANY(%(r)s)",
    "submissions": "run_id = ANY(%(r)s)",
    "approvals": "run_id = ANY(%(r)s)",
    "responses": "thread_id = %(t)s",
    "outbox": "run_id = ANY(%(r)s)",
    "journal": "run_id = ANY(%(r)s)",
}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(
        scripts={"tools": [{"tool_calls": [EMAIL, TICKET]}, {"text": "all done"}]},
        default=[{"text": "hello"}],
    ) as server:
        yield server


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        yield svc


@pytest.fixture
def setup(db_url: str, service: FakeToolService) -> str:
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "create_ticket", "lookup")
        register_tool(conn, service, "send_email", "key")
        registry.register(
            conn,
            registry.ToolSpec(name="approve", executor="client", json_schema={"type": "object"}),
        )
        conn.commit()
    return db_url


def start(
    db_url: str,
    model: ScriptedModel,
    script: str = "tools",
    thread_id: uuid.UUID | None = None,
    tenant: str = TENANT,
    api: str = "responses",
) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = thread_id or writer.create_thread(conn, tenant).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=tenant,
                thread_id=thread,
                model="scripted-1",
                message=f"script:{script} please help",
                tools=["create_ticket", "send_email", "approve"],
                base_url=model.url + "/v1",
                api=api,
            ),
        )
        conn.commit()
    return run


def ended(db_url: str, run_id: uuid.UUID) -> bool:
    status = scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id])
    return status in ("completed", "failed", "cancelled", "expired")


def age(conn: psycopg.Connection[Any], thread_id: uuid.UUID, by: timedelta) -> None:
    """Move a conversation's every timestamp back by ``by``."""
    params = {"t": thread_id, "by": by}
    conn.execute(
        "UPDATE outbox.threads SET created_at = created_at - %(by)s WHERE id = %(t)s", params
    )
    conn.execute(
        "UPDATE outbox.runs SET created_at = created_at - %(by)s, "
        "updated_at = updated_at - %(by)s, ended_at = ended_at - %(by)s WHERE thread_id = %(t)s",
        params,
    )
    conn.execute(
        "UPDATE outbox.messages SET created_at = created_at - %(by)s WHERE thread_id = %(t)s",
        params,
    )
    conn.commit()


def run_ids(conn: psycopg.Connection[Any], thread_id: uuid.UUID) -> list[uuid.UUID]:
    rows = conn.execute(
        "SELECT id FROM outbox.runs WHERE thread_id = %s ORDER BY id", [thread_id]
    ).fetchall()
    return [r[0] for r in rows]


def rows_under(
    conn: psycopg.Connection[Any], thread_id: uuid.UUID, runs: list[uuid.UUID]
) -> dict[str, int]:
    counts = {}
    for table, where in UNDER_THREAD.items():
        row = conn.execute(
            f"SELECT count(*) FROM outbox.{table} WHERE {where}", {"t": thread_id, "r": runs}
        ).fetchone()
        assert row is not None
        counts[table] = row[0]
    conn.commit()
    return counts


def timeline(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT seq, event, journal_id, tenant_id, at FROM outbox.run_timeline "
        "WHERE run_id = %s ORDER BY seq",
        [run_id],
    ).fetchall()
    conn.commit()
    return rows


def retain(db_url: str, **kw: Any) -> retention.Retained:
    with psycopg.connect(db_url) as conn:
        return retention.run(conn, actor="ops@test", **kw)


def set_policy(db_url: str, tenant: str, mode: str, max_age: timedelta = HOUR) -> None:
    with psycopg.connect(db_url) as conn:
        retention.set_policy(conn, tenant, max_age, mode=mode, actor="ops@test")
        conn.commit()


def test_an_idle_conversation_is_archived_whole_and_its_timeline_still_answers(setup, model, conn):
    first = start(setup, model)
    with relay_thread(setup, kinds=ALL_KINDS):
        wait_until(lambda: ended(setup, first.id), what="the first run to end")
        second = start(setup, model, thread_id=first.thread_id, api="chat")
        wait_until(lambda: ended(setup, second.id), what="the continued run to end")
    runs = run_ids(conn, first.thread_id)
    before = rows_under(conn, first.thread_id, runs)
    assert all(before[t] > 0 for t in ("tool_calls", "tool_results", "submissions", "journal"))
    assert scalar(
        setup,
        "SELECT count(*) FROM outbox.journal WHERE thread_id = %s AND event = 'thread.created'",
        [first.thread_id],
    )
    timelines = {r: timeline(conn, r) for r in runs}
    set_policy(setup, "*", "archive")
    assert retain(setup).threads == 0  # not idle for an hour yet
    age(conn, first.thread_id, 2 * HOUR)

    done = retain(setup)

    assert (done.threads, done.runs) == (1, 2)
    assert done.per_tenant == {(TENANT, "archive"): {"threads": 1, "runs": 2}}
    assert rows_under(conn, first.thread_id, runs) == dict.fromkeys(UNDER_THREAD, 0)
    thread_events = conn.execute(
        "SELECT event FROM outbox.journal WHERE thread_id = %s AND run_id IS NULL",
        [first.thread_id],
    ).fetchall()
    assert thread_events == [("thread.retained",)]  # thread.created went with the thread
    for run_id in runs:
        assert timeline(conn, run_id) == timelines[run_id]
    documents = conn.execute(
        "SELECT run_id, document FROM outbox.archived_runs WHERE thread_id = %s",
        [first.thread_id],
    ).fetchall()
    by_run = {r[0]: r[1] for r in documents}
    assert set(by_run) == {*runs, None}
    archived = {
        table: sum(len(by_run[r][table]) for r in runs)
        for table in ("tool_calls", "tool_results", "submissions", "model_turns", "journal")
    }
    assert archived == {t: before[t] for t in archived}
    assert sum(len(d["messages"]) for d in by_run.values()) == before["messages"]
    event = conn.execute(
        "SELECT tenant_id, actor, detail FROM outbox.journal "
        "WHERE event = 'thread.retained' AND thread_id = %s",
        [first.thread_id],
    ).fetchone()
    assert event == (
        TENANT,
        "ops@test",
        {
            "mode": "archive",
            "runs": sorted(str(r) for r in runs),
            "last_active_before": event[2]["last_active_before"],
        },
    )


def test_a_tenant_policy_beats_the_default_and_delete_keeps_nothing_but_the_account(
    setup, model, conn
):
    run = ended_run(conn)
    other_tenant = ended_run(conn, tenant="globex")
    set_policy(setup, "*", "archive")
    set_policy(setup, TENANT, "delete")
    age(conn, run.thread_id, 2 * HOUR)
    age(conn, other_tenant.thread_id, 2 * HOUR)

    done = retain(setup)

    assert done.per_tenant == {
        (TENANT, "delete"): {"threads": 1, "runs": 1},
        ("globex", "archive"): {"threads": 1, "runs": 1},
    }
    assert (
        scalar(setup, "SELECT count(*) FROM outbox.archived_runs WHERE tenant_id = %s", [TENANT])
        == 0
    )
    assert rows_under(conn, run.thread_id, [run.id]) == dict.fromkeys(UNDER_THREAD, 0)
    detail = scalar(
        setup,
        "SELECT detail FROM outbox.journal WHERE event = 'thread.retained' AND thread_id = %s",
        [run.thread_id],
    )
    assert (detail["mode"], detail["runs"]) == ("delete", [str(run.id)])


def ended_run(conn: psycopg.Connection[Any], **kw: Any) -> writer.RunRef:
    """A run on a new thread, cancelled: over, with its messages."""
    run = new_run(conn, tools=[], **kw)
    lifecycle.cancel_run(conn, run.id, actor="test")
    conn.commit()
    return run


def test_runs_in_flight_or_waiting_and_their_threads_are_never_touched(setup, model, conn):
    set_policy(setup, "*", "delete")
    queued = new_run(conn, tools=["send_email"])  # in flight: its model turn is queued
    conn.commit()
    parked = new_run(conn, tools=["send_email"])
    refs = writer.record_model_turn(conn, turn(parked, 1, ("c1", "send_email", {"to": "x"})))
    conn.commit()
    ops.quarantine(conn, f"call:{refs.tool_call_refs[0]}", reason="check it", actor="ops")
    conn.commit()  # waiting for an operator
    waiting = new_run(conn, tools=["approve"])
    writer.record_model_turn(conn, turn(waiting, 1, ("c1", "approve", {})))
    # Waiting for the client's outputs (requires_action), with nothing queued: the model
    # turn's row a relay would have finished is gone.
    conn.execute("DELETE FROM outbox.outbox WHERE run_id = %s", [waiting.id])
    conn.commit()
    old_then_active = ended_run(conn)
    new_run(conn, thread_id=old_then_active.thread_id, tools=[])
    conn.commit()  # an old run ended, a new one in flight on the same thread
    recent_message = ended_run(conn)
    control = ended_run(conn)
    keep = [queued, parked, waiting, old_then_active, recent_message]
    for run in [*keep, control]:
        age(conn, run.thread_id, 2 * HOUR)
    writer.append_message(conn, recent_message.thread_id, TENANT, "user", "still here?")
    conn.commit()
    assert scalar(setup, "SELECT status FROM outbox.runs WHERE id = %s", [waiting.id]) == (
        "requires_action"
    )
    before = {r.thread_id: rows_under(conn, r.thread_id, run_ids(conn, r.thread_id)) for r in keep}

    done = retain(setup)

    assert (done.threads, done.runs) == (1, 1)  # the control only
    assert (
        scalar(setup, "SELECT count(*) FROM outbox.threads WHERE id = %s", [control.thread_id]) == 0
    )
    after = {r.thread_id: rows_under(conn, r.thread_id, run_ids(conn, r.thread_id)) for r in keep}
    assert after == before


def test_what_someone_holds_is_skipped_not_waited_for(setup, model, conn):
    set_policy(setup, "*", "archive")
    held_run = ended_run(conn)
    continued = ended_run(conn)
    for run in (held_run, continued):
        age(conn, run.thread_id, 2 * HOUR)
    with psycopg.connect(setup) as relay, psycopg.connect(setup) as backend:
        # A relay holds one ended run (ending it, recording a late result) ...
        relay.execute("SELECT 1 FROM outbox.runs WHERE id = %s FOR UPDATE", [held_run.id])
        # ... and a backend is starting a run on the other thread, not yet committed.
        started = new_run(backend, thread_id=continued.thread_id, tools=[])
        assert retain(setup).threads == 0  # returned at once: nothing was waited for
        relay.rollback()
        backend.commit()
    done = retain(setup)
    assert done.threads == 1  # the held run's thread, now free
    assert scalar(setup, "SELECT status FROM outbox.runs WHERE id = %s", [started.id]) == "queued"
    assert len(run_ids(conn, continued.thread_id)) == 2  # the continued thread is whole


def test_a_start_on_a_thread_being_retained_finds_no_thread(setup, model, conn):
    set_policy(setup, "*", "delete")
    old = ended_run(conn)
    age(conn, old.thread_id, 2 * HOUR)
    with psycopg.connect(setup) as retainer:
        assert retention.retain_chunk(retainer, actor="ops")[0]["threads"] == 1
        failed: list[BaseException] = []

        def start_on_it() -> None:
            with psycopg.connect(setup) as backend:
                try:
                    new_run(backend, thread_id=old.thread_id, tools=[])
                    backend.commit()
                except OutboxError as err:
                    failed.append(err)

        starter = threading.Thread(target=start_on_it)
        starter.start()
        wait_until(
            lambda: scalar(
                setup,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()",
            ),
            what="the start to wait for the retention chunk",
        )
        retainer.commit()
        starter.join(timeout=30)
    assert len(failed) == 1 and "does not exist" in str(failed[0])
    assert (
        scalar(setup, "SELECT count(*) FROM outbox.runs WHERE thread_id = %s", [old.thread_id]) == 0
    )


def test_the_journal_opens_only_for_the_runs_retention_removed(setup, model, conn):
    set_policy(setup, "*", "delete")
    gone = ended_run(conn)
    age(conn, gone.thread_id, 2 * HOUR)
    assert retain(setup).threads == 1
    alive = ended_run(conn)
    stray = uuid.uuid4()  # an event filed under a run id that never existed
    conn.execute(
        "INSERT INTO outbox.journal (tenant_id, event, run_id) VALUES (%s, 'x', %s)",
        [TENANT, stray],
    )
    conn.commit()
    event = scalar(setup, "SELECT max(id) FROM outbox.journal WHERE event = 'thread.retained'")

    def delete(flag: int | None, run_id: uuid.UUID, own_event: bool = False) -> None:
        with psycopg.connect(setup) as c:
            if own_event:
                flag = c.execute(
                    "INSERT INTO outbox.journal (tenant_id, event) "
                    "VALUES ('*', 'thread.retained') RETURNING id"
                ).fetchone()[0]
            c.execute("SELECT set_config('outbox.journal_retain', %s, true)", [str(flag)])
            c.execute("DELETE FROM outbox.journal WHERE run_id = %s", [run_id])

    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        delete(event, stray)  # an event of another transaction opens nothing
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        delete(None, alive.id, own_event=True)  # a run that still exists keeps its events
    delete(None, stray, own_event=True)  # the door: own event, no such run
    assert scalar(setup, "SELECT count(*) FROM outbox.journal WHERE run_id = %s", [stray]) == 0


def test_retention_knows_every_table_that_references_a_conversation(conn):
    """A table added later with a foreign key to a conversation's rows must be taught to
    retain_v1 (else retention would fail on it forever, or leave rows behind)."""
    referencing = {
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT c.conrelid::regclass::text FROM pg_constraint c "
            "WHERE c.contype = 'f' AND c.confrelid::regclass::text = ANY(%s)",
            [
                [
                    f"outbox.{t}"
                    for t in (
                        "threads",
                        "runs",
                        "messages",
                        "tool_batches",
                        "tool_calls",
                        "responses",
                    )
                ]
            ],
        ).fetchall()
    }
    body = scalar(conn.info.dsn, "SELECT pg_get_functiondef('outbox.retain_v1'::regproc)")
    body = body.replace('"outbox".', "outbox.")
    missing = {t for t in referencing if f"DELETE FROM {t} " not in body}
    assert missing == set()


def test_retention_racing_a_relay_and_continued_threads_loses_nothing(setup, model, conn):
    """Runs start, finish and are continued on the same threads while two retainers (the
    relay's maintenance and an operator's loop) retain at a very short age: every run is
    accounted for (hot, archived or journaled as deleted), every continuation either ran on
    a whole history or found no thread, and no hot thread's history needs a repair."""
    set_policy(setup, "*", "archive", max_age=timedelta(milliseconds=300))
    set_policy(setup, "globex", "delete", max_age=timedelta(milliseconds=300))
    started: list[writer.RunRef] = []
    refused: list[str] = []
    stop = threading.Event()

    def operator_loop() -> None:
        with psycopg.connect(setup) as c:
            while not stop.wait(0.05):  # an operator's loop, paced
                # a chunk that gave up waiting for a lock changed nothing
                with contextlib.suppress(psycopg.errors.LockNotAvailable):
                    retention.run(c, actor="operator", chunk=5)

    rng = random.Random(7)
    with relay_thread(setup, kinds=ALL_KINDS, retention_interval_s=0.2, retention_chunk=3):
        operator = threading.Thread(target=operator_loop)
        operator.start()
        try:
            for i in range(24):
                tenant = TENANT if i % 2 else "globex"
                mine = [r for r in started if r.tenant_id == tenant]
                previous = rng.choice(mine) if mine and rng.random() < 0.5 else None
                try:
                    run = start(
                        setup,
                        model,
                        script="tools" if i % 3 else "plain",
                        thread_id=previous.thread_id if previous else None,
                        tenant=tenant,
                        api="chat" if i % 4 == 0 else "responses",
                    )
                except OutboxError as err:
                    assert "does not exist" in str(err) or "active run" in str(err), err
                    refused.append(str(err))
                    continue
                started.append(run)
            # Also until a thread was retained: on a fast machine every run can end before
            # any thread has been idle for the policies' age.
            wait_until(
                lambda: (
                    all(
                        ended(setup, r.id)
                        or scalar(setup, "SELECT count(*) FROM outbox.runs WHERE id = %s", [r.id])
                        == 0
                        for r in started
                    )
                    and scalar(
                        setup, "SELECT count(*) FROM outbox.journal WHERE event = 'thread.retained'"
                    )
                    > 0
                ),
                timeout_s=60,
                what="every run to end or be retained, and a thread retained",
            )
        finally:
            stop.set()
            operator.join(timeout=30)
    hot = {r[0] for r in conn.execute("SELECT id FROM outbox.runs").fetchall()}
    archived = {r[0] for r in conn.execute("SELECT run_id FROM outbox.archived_runs").fetchall()}
    deleted = {
        uuid.UUID(x)
        for (d,) in conn.execute(
            "SELECT detail FROM outbox.journal WHERE event = 'thread.retained'"
        ).fetchall()
        if d["mode"] == "delete"
        for x in d["runs"]
    }
    conn.commit()
    ids = {r.id for r in started}
    assert ids <= hot | archived | deleted
    assert not (hot & archived) and not (hot & deleted)
    assert all(
        d["run"]["status"] in ("completed", "failed", "cancelled", "expired")
        for (d,) in conn.execute(
            "SELECT document FROM outbox.archived_runs WHERE run_id IS NOT NULL"
        ).fetchall()
    )
    assert archived | deleted, "retention never ran: the test proves nothing"
    for thread_id, tenant in conn.execute("SELECT id, tenant_id FROM outbox.threads").fetchall():
        _, report = history.replay(conn, thread_id, tenant, api="chat")
        assert not report.changed, report.as_detail()
    conn.commit()


def test_the_retention_commands(db_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", db_url)

    def outbox(*args: str) -> Any:
        return CliRunner().invoke(cli.main, list(args))

    assert json.loads(outbox("retention", "show", "--json").output) == {"policies": []}
    default = outbox("retention", "set", "--age", "30d", "--archive-keep", "365d", "--json")
    assert json.loads(default.output)["max_age_s"] == 30 * 86400
    own = outbox("retention", "set", "--tenant", "globex", "--age", "7d", "--mode", "delete")
    assert own.exit_code == 0 and "idle for 7d are deleted" in own.output
    refused = outbox(
        "retention", "set", "--tenant", "globex", "--age", "7d", "--archive-keep", "1d"
    )
    assert refused.exit_code == 2 and "only to the default policy" in refused.output
    assert "is not an age" in outbox("retention", "set", "--age", "soon").output
    shown = json.loads(outbox("retention", "show", "--due", "--json").output)
    assert [p["tenant_id"] for p in shown["policies"]] == ["*", "globex"]
    assert shown["due"] == []
    done = json.loads(outbox("retention", "run", "--json").output)
    assert (done["threads"], done["complete"], done["archive_partitions_made"]) == (0, True, 3)
    missing = outbox("retention", "unset", "--tenant", "nobody")
    assert missing.exit_code == 2 and "has no retention policy" in missing.output
    assert outbox("retention", "unset", "--tenant", "globex").exit_code == 0
    events = scalar(
        db_url,
        "SELECT array_agg(event ORDER BY id) FROM outbox.journal WHERE event LIKE 'retention.%'",
    )
    assert events == [
        "retention.policy_set",
        "retention.policy_set",
        "retention.policy_removed",
    ]


def test_a_run_started_while_retention_chooses_keeps_its_thread(setup, conn):
    """The window between the chunk's choice of a thread and its lock: a run started and
    committed there is seen by the check made again under the locks. The window is held
    open by making the policy lookup wait on an advisory lock the test holds."""
    set_policy(setup, "*", "delete")
    old = ended_run(conn)
    age(conn, old.thread_id, 2 * HOUR)
    conn.execute(
        """
        ALTER FUNCTION outbox.retention_cutoff_v1(text) RENAME TO retention_cutoff_real;
        CREATE FUNCTION outbox.retention_cutoff_v1(p_tenant_id text) RETURNS timestamptz
        LANGUAGE plpgsql STABLE AS $$
        BEGIN
            IF current_setting('test.hold', true) = 'on' THEN
                PERFORM set_config('test.hold', 'off', false);
                PERFORM pg_advisory_lock(4242);
                PERFORM pg_advisory_unlock(4242);
            END IF;
            RETURN outbox.retention_cutoff_real(p_tenant_id);
        END $$;
        """
    )
    conn.commit()
    chosen: list[list[dict[str, Any]]] = []
    with psycopg.connect(setup, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(4242)")

        def retain_held() -> None:
            with psycopg.connect(setup) as retainer:
                retainer.execute("SELECT set_config('test.hold', 'on', false)")
                chosen.append(retention.retain_chunk(retainer, actor="ops"))
                retainer.commit()

        retainer = threading.Thread(target=retain_held)
        retainer.start()
        wait_until(
            lambda: scalar(
                setup,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
                "AND datname = current_database()",
            ),
            what="the chunk to stop between its choice and its locks",
        )
        started = new_run(conn, thread_id=old.thread_id, tools=[])
        conn.commit()
        gate.execute("SELECT pg_advisory_unlock(4242)")
        retainer.join(timeout=30)
    assert chosen == [[]]
    assert scalar(setup, "SELECT status FROM outbox.runs WHERE id = %s", [started.id]) == "queued"
    assert len(run_ids(conn, old.thread_id)) == 2


def _threads_read(conn: psycopg.Connection[Any]) -> int:
    """Index entries of threads_created read so far by this database's backends."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.commit()
    conn.execute("SELECT pg_stat_clear_snapshot()")
    (n,) = conn.execute(
        "SELECT idx_tup_read FROM pg_stat_user_indexes "
        "WHERE schemaname = 'outbox' AND indexrelname = 'threads_created'"
    ).fetchone()
    conn.commit()
    return int(n)


def test_a_round_of_retention_reads_each_busy_old_thread_once_not_once_per_chunk(db_url, conn):
    """Old threads that are not idle (a run in flight) come first in the candidate scan's
    order; each chunk of a round goes on from the horizon the previous one returned, so they
    are read by the first chunk only. Without the horizon, every chunk read them again."""
    set_policy(db_url, "*", "delete")
    busy, idle, chunk = 100, 30, 10
    for _ in range(busy):
        age(conn, new_run(conn, tenant=TENANT).thread_id, 3 * HOUR)  # queued: in flight
    for _ in range(idle):
        age(conn, writer.create_thread(conn, TENANT).id, 2 * HOUR)
    conn.execute("SET enable_seqscan = off")  # the scan a large table gets, on a small one
    before = _threads_read(conn)
    done = retention.run(conn, actor="ops@test", chunk=chunk)
    read = _threads_read(conn) - before
    assert (done.threads, done.chunks) == (idle, idle // chunk + 1)
    # One chunk reads the busy ones and its own ten; the others only their own.
    assert busy + idle <= read < 2 * (busy + idle), read
    assert conn.execute("SELECT count(*) FROM outbox.threads").fetchone() == (busy,)


def test_retention_reads_no_journal_day_older_than_the_conversations_it_removes(db_url, conn):
    """retain_v1 deletes a conversation's events with a bound: none is older than its
    thread, so older days' indexes are not probed, however many days the journal keeps."""
    from tests.integration.test_journal_partitions import make_day, today

    set_policy(db_url, "*", "delete")
    old = make_day(conn, today(conn) - timedelta(days=10))
    conn.commit()
    for _ in range(3):
        run = ended_run(conn)
        age(conn, run.thread_id, 2 * HOUR)

    def probes() -> int:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (n,) = conn.execute(
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes "
            "WHERE schemaname = 'outbox' AND relname = %s",
            [old],
        ).fetchone()
        conn.commit()
        return int(n)

    before = probes()
    assert retention.run(conn, actor="ops@test").threads == 3
    assert probes() == before
    assert conn.execute(
        "SELECT count(*) FROM outbox.journal WHERE run_id IS NOT NULL"
    ).fetchone() == (0,)
