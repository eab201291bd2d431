"""The journal partitioned by day (migration 0036): every partition stays append-only,
pruning drops whole days, an insert never fails for want of a partition, and a populated
journal is converted (and converted back) without losing a row.

Old days are made the way journal_partitions_v1 makes days ahead (a table like the journal,
attached for one UTC day), by the owner, because the function only makes today and later.
"""

from __future__ import annotations

import threading
import time
import types
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest

from outbox import migrate, retention
from tests.helpers import new_run
from tests.relay_harness import relay_thread, wait_until

REFUSED = psycopg.errors.InsufficientPrivilege


def partitions(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'outbox.journal'::regclass ORDER BY 1"
    ).fetchall()
    return [r[0] for r in rows]


def today(conn: psycopg.Connection[Any]) -> date:
    (day,) = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()
    return day


def day_name(day: date) -> str:
    return f"journal_{day:%Y%m%d}"


def make_day(conn: psycopg.Connection[Any], day: date) -> str:
    """A day partition as journal_partitions_v1 makes one, for a day in the past."""
    name = day_name(day)
    conn.execute(f"CREATE TABLE outbox.{name} (LIKE outbox.journal INCLUDING DEFAULTS)")
    start = f"'{day.isoformat()}'::timestamp AT TIME ZONE 'UTC'"
    end = f"'{(day + timedelta(days=1)).isoformat()}'::timestamp AT TIME ZONE 'UTC'"
    conn.execute(
        f"ALTER TABLE outbox.journal ATTACH PARTITION outbox.{name} "
        f"FOR VALUES FROM ({start}) TO ({end})"
    )
    conn.execute(
        f"CREATE TRIGGER journal_no_truncate BEFORE TRUNCATE ON outbox.{name} "
        "FOR EACH STATEMENT EXECUTE FUNCTION outbox.journal_refuse_change()"
    )
    return name


def days_ahead(conn: psycopg.Connection[Any]) -> None:
    """Today's and the next two days' partitions, as the migration made them: a test
    database cloned from a template made before midnight (UTC) lacks the newest."""
    conn.execute("SELECT outbox.journal_partitions_v1(2)")
    conn.commit()


def where(conn: psycopg.Connection[Any], event: str) -> str:
    (rel,) = conn.execute(
        "SELECT tableoid::regclass::text FROM outbox.journal WHERE event = %s", [event]
    ).fetchone()
    return str(rel).removeprefix("outbox.")


def test_the_migration_makes_today_and_the_days_ahead_and_a_default(conn):
    days_ahead(conn)
    day = today(conn)
    names = partitions(conn)
    assert "journal_default" in names
    assert {day_name(day + timedelta(days=k)) for k in range(3)} <= set(names)
    assert conn.execute("SELECT outbox.journal_partitions_v1(2)").fetchone() == (0,)
    assert conn.execute("SELECT outbox.journal_partitions_v1(4)").fetchone() == (2,)
    assert day_name(day + timedelta(days=4)) in partitions(conn)


def test_a_row_no_day_covers_lands_in_the_default_and_keeps_its_day_from_being_made(conn):
    days_ahead(conn)
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) VALUES "
        "(now() + interval '6 days', 'acme', 'future'), (now(), 'acme', 'present'), "
        "(now() - interval '40 days', 'acme', 'past')"
    )
    assert where(conn, "future") == "journal_default"
    assert where(conn, "past") == "journal_default"
    assert where(conn, "present") == day_name(today(conn))
    # The day the default caught a row of gets no partition: the row is not moved.
    assert conn.execute("SELECT outbox.journal_partitions_v1(7)").fetchone() == (4,)
    names = partitions(conn)
    assert day_name(today(conn) + timedelta(days=6)) not in names
    assert day_name(today(conn) + timedelta(days=7)) in names
    assert where(conn, "future") == "journal_default"


def test_every_partition_refuses_update_delete_and_truncate(conn):
    days_ahead(conn)
    old = make_day(conn, today(conn) - timedelta(days=10))
    # A row in every partition: a partition with no row fires no row trigger.
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) VALUES "
        "(now() - interval '10 days', 'acme', 'in_old_day'), (now(), 'acme', 'in_today'), "
        "(now() + interval '1 day', 'acme', 'in_tomorrow'), "
        "(now() + interval '2 days', 'acme', 'in_two_days'), "
        "(now() - interval '40 days', 'acme', 'in_default')"
    )
    conn.commit()
    assert where(conn, "in_old_day") == old
    for name in partitions(conn):
        for statement in (
            f"UPDATE outbox.{name} SET event = 'forged'",
            f"DELETE FROM outbox.{name}",
            f"TRUNCATE outbox.{name}",
        ):
            with pytest.raises(REFUSED, match="append-only"):
                conn.execute(statement)
            conn.rollback()
    for statement in (
        "UPDATE outbox.journal SET event = 'forged'",
        "UPDATE outbox.journal SET at = at - interval '1 day' WHERE event = 'in_today'",
        "DELETE FROM outbox.journal",
        "TRUNCATE outbox.journal",
    ):
        with pytest.raises(REFUSED, match="append-only"):
            conn.execute(statement)
        conn.rollback()
    assert conn.execute("SELECT count(*) FROM outbox.journal").fetchone() == (5,)


def test_the_prune_door_opens_on_no_day_partition(conn):
    """A journal.pruned event of this very transaction opens the guard's door on the
    default partition (rows pruned by row) but on no day: days leave only whole."""
    conn.execute("INSERT INTO outbox.journal (tenant_id, event) VALUES ('acme', 'evidence')")
    conn.commit()
    (event_id,) = conn.execute(
        "INSERT INTO outbox.journal (tenant_id, event, detail) VALUES ('*', 'journal.pruned', "
        "jsonb_build_object('before', now() + interval '1 day')) RETURNING id"
    ).fetchone()
    conn.execute("SELECT set_config('outbox.journal_prune', %s, true)", [str(event_id)])
    with pytest.raises(REFUSED, match="append-only"):
        conn.execute("DELETE FROM outbox.journal WHERE event = 'evidence'")
    conn.rollback()
    assert conn.execute(
        "SELECT count(*) FROM outbox.journal WHERE event = 'evidence'"
    ).fetchone() == (1,)


def test_prune_drops_whole_days_and_deletes_only_default_rows_by_row(conn):
    days_ahead(conn)
    day = today(conn)
    gone = make_day(conn, day - timedelta(days=40))
    kept = make_day(conn, day - timedelta(days=20))
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) VALUES "
        "(now() - interval '40 days', 'acme', 'old_day'), "
        "(now() - interval '40 days', 'acme', 'old_day'), "
        "(now() - interval '20 days', 'acme', 'recent_day'), "
        "(now() - interval '50 days', 'acme', 'old_default'), "
        "(now() - interval '25 days', 'acme', 'recent_default'), "
        "(now(), 'acme', 'today')"
    )
    conn.commit()
    assert conn.execute("SELECT outbox.prune_journal(interval '30 days', 'dba')").fetchone() == (3,)
    conn.commit()
    names = partitions(conn)
    assert gone not in names and kept in names
    events = sorted(e for (e,) in conn.execute("SELECT event FROM outbox.journal"))
    assert events == ["journal.pruned", "recent_day", "recent_default", "today"]
    ((actor, detail),) = conn.execute(
        "SELECT actor, detail FROM outbox.journal WHERE event = 'journal.pruned'"
    ).fetchall()
    assert actor == "dba" and detail["removed"] == 3 and detail["partitions_dropped"] == [gone]
    # A day that straddles the cut-off stays whole until it is past it: nothing of today's
    # partition goes, even with an age shorter than a day. (Today's first instant: an event
    # "two hours ago" fell on yesterday, in the default, when the test ran after midnight.)
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) VALUES "
        "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 'acme', 'midnight')"
    )
    conn.commit()
    # (the 20-day-old day and the default's 25-day-old row go)
    pruned = conn.execute("SELECT outbox.prune_journal(interval '1 millisecond')").fetchone()
    assert pruned == (2,)
    conn.commit()
    events = sorted(e for (e,) in conn.execute("SELECT event FROM outbox.journal"))
    assert events == ["journal.pruned", "journal.pruned", "midnight", "today"]
    assert kept not in partitions(conn)


def test_retention_run_makes_the_journals_days_ahead(conn):
    days_ahead(conn)
    conn.commit()
    assert conn.execute("SELECT outbox.journal_partitions_v1(5)").fetchone() == (3,)
    conn.commit()
    done = retention.run(conn, actor="ops")
    assert done.as_json()["journal_partitions_made"] == 0
    assert retention.journal_partitions(conn, days_ahead=6) == 1


def test_reads_by_run_and_by_id_use_an_index_in_every_partition(conn):
    conn.execute("SET enable_seqscan = off")
    for query in (
        "SELECT * FROM outbox.journal WHERE run_id = gen_random_uuid() ORDER BY id",
        "SELECT * FROM outbox.journal WHERE id > 10 ORDER BY id LIMIT 50",
        "SELECT * FROM outbox.journal WHERE thread_id = gen_random_uuid() AND run_id IS NULL",
    ):
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {query}"))
        assert "Seq Scan" not in plan, plan


def _snapshot(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as c:
        return c.execute(
            "SELECT count(*), coalesce(sum(id), 0), "
            "md5(string_agg(j::text, '|' ORDER BY j.id)) FROM outbox.journal j"
        ).fetchone()


def test_a_populated_journal_is_converted_without_losing_a_row_and_back(empty_db_url):
    migrate.upgrade(empty_db_url, "0035", schema="outbox")
    with psycopg.connect(empty_db_url) as c:
        c.execute(
            "INSERT INTO outbox.journal (at, tenant_id, event, run_id, detail) "
            "SELECT now() - make_interval(days => k % 60), 't' || (k % 3), 'e' || k, "
            "gen_random_uuid(), jsonb_build_object('k', k) FROM generate_series(1, 2000) k"
        )
        (last_id,) = c.execute("SELECT max(id) FROM outbox.journal").fetchone()
    before = _snapshot(empty_db_url)
    assert before[0] == 2000
    migrate.upgrade(empty_db_url, "0036", schema="outbox")
    assert _snapshot(empty_db_url) == before
    with psycopg.connect(empty_db_url) as c:
        day = today(c)
        names = partitions(c)
        assert f"journal_upto_{day:%Y%m%d}" in names and "journal_default" in names
        (relkind,) = c.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'outbox.journal'::regclass"
        ).fetchone()
        assert relkind == "p"
        # The identity goes on past the old rows, and today's rows stay in the old table
        # until its day is over.
        (new_id, rel) = c.execute(
            "INSERT INTO outbox.journal (tenant_id, event) VALUES ('t', 'after') "
            "RETURNING id, tableoid::regclass::text"
        ).fetchone()
        assert new_id > last_id and rel == f"outbox.journal_upto_{day:%Y%m%d}"
        c.commit()
        # The old table is a partition like any other: append-only.
        with pytest.raises(REFUSED, match="append-only"):
            c.execute(f"DELETE FROM outbox.journal_upto_{day:%Y%m%d} WHERE event = 'e1'")
        c.rollback()
        with pytest.raises(REFUSED, match="append-only"):
            c.execute(f"TRUNCATE outbox.journal_upto_{day:%Y%m%d}")
        c.rollback()
        # Pruning trims it by row (it spans more than a day), through the door.
        assert c.execute("SELECT outbox.prune_journal(interval '30 days')").fetchone() == (
            sum(1 for k in range(1, 2001) if k % 60 >= 30),
        )
        c.commit()
    after = _snapshot(empty_db_url)
    migrate.downgrade(empty_db_url, "0035", schema="outbox")
    assert _snapshot(empty_db_url) == after
    with psycopg.connect(empty_db_url) as c:
        (relkind,) = c.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'outbox.journal'::regclass"
        ).fetchone()
        assert relkind == "r"
        (next_id,) = c.execute(
            "INSERT INTO outbox.journal (tenant_id, event) VALUES ('t', 'down') RETURNING id"
        ).fetchone()
        assert next_id > new_id


def test_a_runs_event_stream_reads_no_day_before_the_run(conn):
    """The server's run_events read is bounded by the run's creation: days before it are
    pruned at run time, however many there are."""
    from outbox.server.db_pool import Q

    old = make_day(conn, today(conn) - timedelta(days=3))
    run = new_run(conn)
    conn.commit()
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            f"EXPLAIN (ANALYZE, COSTS OFF) {Q.run_events}",
            {"run_id": run.id, "after_id": 0, "limit": 10},
        )
    )
    # Pruned while executing (the bound is the run's, read in the same query): the day
    # before the run is never scanned; today's is.
    scans = [line for line in plan.splitlines() if "Index Scan" in line and "journal_" in line]
    assert [line for line in scans if old in line] == [
        line for line in scans if old in line and "never executed" in line
    ], plan
    assert any(day_name(today(conn)) in line and "never executed" not in line for line in scans)
    events = conn.execute(Q.run_events, {"run_id": run.id, "after_id": 0, "limit": 10}).fetchone()
    assert [e["event"] for e in events[3]][:1] == ["run.created"]


@pytest.mark.parametrize("uptime_s", [None, 1.0], ids=["any-uptime", "just-booted"])
def test_the_relays_maintenance_makes_the_days_ahead_with_retention_off(
    db_url, conn, monkeypatch, uptime_s
):
    """On its first round, also on a machine booted a second ago: the maintenance's
    clock (time.monotonic) counts from the boot, and the days ahead are made every ten
    minutes."""
    if uptime_s is not None:
        from outbox.relay import maintenance

        real = time.monotonic
        booted = real() - uptime_s
        clock = types.SimpleNamespace(monotonic=lambda: real() - booted)
        monkeypatch.setattr(maintenance, "time", clock)
    days_ahead(conn)
    ahead = day_name(today(conn) + timedelta(days=2))
    conn.execute(f"DROP TABLE outbox.{ahead}")  # an empty day, as if never made
    conn.commit()
    assert ahead not in partitions(conn)
    with relay_thread(db_url, retention_interval_s=0):
        wait_until(lambda: ahead in partitions(conn), what=f"the relay to make {ahead}")


def test_a_journal_reaching_into_the_future_is_converted_and_no_day_overlaps_it(empty_db_url):
    """A row stamped days ahead (a clock far off) stretches the old table's range: no day
    partition is made inside it, and the first one is made right after it."""
    migrate.upgrade(empty_db_url, "0035", schema="outbox")
    with psycopg.connect(empty_db_url) as c:
        c.execute(
            "INSERT INTO outbox.journal (at, tenant_id, event) VALUES "
            "(now(), 't', 'now'), (now() + interval '4 days', 't', 'ahead')"
        )
    migrate.upgrade(empty_db_url, "0036", schema="outbox")
    with psycopg.connect(empty_db_url) as c:
        last = today(c) + timedelta(days=4)
        assert partitions(c) == ["journal_default", f"journal_upto_{last:%Y%m%d}"]
        assert c.execute("SELECT outbox.journal_partitions_v1(6)").fetchone() == (2,)
        assert partitions(c) == [
            *(day_name(last + timedelta(days=k)) for k in (1, 2)),
            "journal_default",
            f"journal_upto_{last:%Y%m%d}",
        ]
        c.commit()
    assert _snapshot(empty_db_url)[0] == 2


# The partition width (outbox.journal_partition_width): the tests set it for their session,
# as `ALTER DATABASE ... SET` sets it for every session of the relay and of cron.

BOUNDS = (
    "SELECT c.relname, "
    "(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''([^'']+)''\\)'))[1]"
    "::timestamptz AS lo, "
    "(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \\(''([^'']+)''\\)'))[1]"
    "::timestamptz AS hi "
    "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = 'outbox.journal'::regclass AND c.relname <> 'journal_default' "
    "ORDER BY hi"
)


def spans(conn: psycopg.Connection[Any]) -> list[tuple[str, Any, Any]]:
    return [tuple(r) for r in conn.execute(BOUNDS).fetchall()]


def width(conn: psycopg.Connection[Any], value: str) -> None:
    conn.execute("SELECT set_config('outbox.journal_partition_width', %s, false)", [value])


def drop_empty_ahead(conn: psycopg.Connection[Any]) -> None:
    """What an operator does for a new width to apply now rather than after the partitions
    made ahead: drop the empty ones that are not past (the owner may drop a table)."""
    for name, _lo, hi in spans(conn):
        (rows,) = conn.execute(f"SELECT count(*) FROM outbox.{name}").fetchone()
        (ahead,) = conn.execute("SELECT %s::timestamptz > now()", [hi]).fetchone()
        if ahead and rows == 0:
            conn.execute(f"DROP TABLE outbox.{name}")
    (covered,) = conn.execute(f"SELECT count(*) FROM ({BOUNDS}) b WHERE b.hi > now()").fetchone()
    assert covered == 0, spans(conn)


def assert_contiguous(chain: list[tuple[str, Any, Any]]) -> None:
    for (name, lo, hi), (next_name, next_lo, _) in pairwise(chain):
        assert lo is None or lo < hi, name
        assert next_lo == hi, f"{name} ends {hi}, {next_name} starts {next_lo}"


def test_a_width_of_minutes_makes_minute_partitions_and_prune_drops_them(conn):
    days_ahead(conn)
    drop_empty_ahead(conn)
    width(conn, "1 minute")
    (minute,) = conn.execute("SELECT date_trunc('minute', now())").fetchone()
    assert conn.execute("SELECT outbox.journal_partitions_v1(3)").fetchone() == (4,)
    made = [s for s in spans(conn) if s[2] > minute]
    assert [(lo, hi) for _, lo, hi in made] == [
        (minute + timedelta(minutes=k), minute + timedelta(minutes=k + 1)) for k in range(4)
    ]
    assert [name for name, _, _ in made] == [
        f"journal_{(minute + timedelta(minutes=k)).astimezone(UTC):%Y%m%d_%H%M}" for k in range(4)
    ]
    assert conn.execute("SELECT outbox.journal_partitions_v1(3)").fetchone() == (0,)
    # A minute ten minutes ago, made by hand as the function would have made it then.
    past = f"journal_{(minute - timedelta(minutes=10)).astimezone(UTC):%Y%m%d_%H%M}"
    conn.execute(f"CREATE TABLE outbox.{past} (LIKE outbox.journal INCLUDING DEFAULTS)")
    conn.execute(
        f"ALTER TABLE outbox.journal ATTACH PARTITION outbox.{past} FOR VALUES "
        "FROM (date_trunc('minute', now()) - interval '10 minutes') "
        "TO (date_trunc('minute', now()) - interval '9 minutes')"
    )
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) VALUES "
        "(date_trunc('minute', now()) - interval '10 minutes', 'acme', 'old'), "
        "(date_trunc('minute', now()) - interval '10 minutes', 'acme', 'old'), "
        "(now(), 'acme', 'now')"
    )
    assert where(conn, "now") == made[0][0]
    conn.commit()
    # Nothing of the current minute goes, however short the age: it straddles the cut-off.
    assert conn.execute("SELECT outbox.prune_journal(interval '5 minutes')").fetchone() == (2,)
    (detail,) = conn.execute(
        "SELECT detail FROM outbox.journal WHERE event = 'journal.pruned'"
    ).fetchone()
    assert detail["partitions_dropped"] == [past]
    conn.commit()
    assert past not in partitions(conn)
    assert conn.execute("SELECT outbox.prune_journal(interval '1 second')").fetchone() == (0,)
    conn.commit()
    assert made[0][0] in partitions(conn)
    assert sorted(e for (e,) in conn.execute("SELECT event FROM outbox.journal")) == [
        "journal.pruned",
        "journal.pruned",
        "now",
    ]


def test_a_width_change_starts_where_the_last_partition_ends(conn):
    days_ahead(conn)
    before = spans(conn)
    # The days made ahead stay: hours start where the last of them ends.
    width(conn, "1 hour")
    assert conn.execute("SELECT outbox.journal_partitions_v1(2)").fetchone() == (0,)
    assert spans(conn) == before
    assert conn.execute("SELECT outbox.journal_partitions_v1(80)").fetchone() > (0,)
    hours = spans(conn)[len(before) :]
    assert hours and all(hi - lo == timedelta(hours=1) for _, lo, hi in hours)
    assert all(
        name.endswith("00") and len(name) == len("journal_20261127_1500") for name, *_ in hours
    )
    # A width the hours do not divide: the first span ends on its next boundary.
    width(conn, "25 minutes")
    assert conn.execute("SELECT outbox.journal_partitions_v1(300)").fetchone() > (0,)
    odd = spans(conn)[len(before) + len(hours) :]
    assert odd and all(hi - lo <= timedelta(minutes=25) for _, lo, hi in odd)
    assert all(hi.timestamp() % 1500 == 0 for _, _, hi in odd)
    # Back to days: realigned on UTC midnight, then named by the day.
    width(conn, "1 day")
    assert conn.execute("SELECT outbox.journal_partitions_v1(40)").fetchone() > (0,)
    days = spans(conn)[len(before) + len(hours) + len(odd) :]
    assert days[0][2].astimezone(UTC).time() == datetime.min.time()
    assert all(hi - lo == timedelta(days=1) for _, lo, hi in days[1:])
    assert all(len(name) == len("journal_20261127") for name, *_ in days[1:])
    chain = spans(conn)
    assert_contiguous(chain)
    names = [name for name, *_ in chain]
    assert len(set(names)) == len(names)
    # Every row lands in one partition; none of these spans leaves a gap for the default.
    conn.execute(
        "INSERT INTO outbox.journal (at, tenant_id, event) "
        "SELECT lo + (hi - lo) / 2, 'acme', 'probe' FROM (" + BOUNDS + ") b WHERE lo > now()"
    )
    assert conn.execute(
        "SELECT count(*) FROM outbox.journal_default WHERE event = 'probe'"
    ).fetchone() == (0,)


@pytest.mark.parametrize("value", ["2 days", "banana", "0", "1.5 seconds", "-1 hour"])
def test_a_width_out_of_range_is_refused_by_name(conn, value):
    width(conn, value)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="journal_partition_width") as e:
        conn.execute("SELECT outbox.journal_partitions_v1(2)")
    assert "ALTER DATABASE" in (e.value.diag.message_hint or "")


def test_minute_partitions_are_append_only_and_the_prune_door_stays_shut(conn):
    days_ahead(conn)
    drop_empty_ahead(conn)
    width(conn, "1 minute")
    conn.execute("SELECT outbox.journal_partitions_v1(1)")
    conn.execute("INSERT INTO outbox.journal (at, tenant_id, event) VALUES (now(), 'acme', 'x')")
    conn.commit()
    name = where(conn, "x")
    assert name.startswith("journal_") and len(name) == len("journal_20261127_1500")
    for statement in (
        f"UPDATE outbox.{name} SET event = 'forged'",
        f"DELETE FROM outbox.{name}",
        f"TRUNCATE outbox.{name}",
        "DELETE FROM outbox.journal WHERE event = 'x'",
    ):
        with pytest.raises(REFUSED, match="append-only"):
            conn.execute(statement)
        conn.rollback()
    (event_id,) = conn.execute(
        "INSERT INTO outbox.journal (tenant_id, event, detail) VALUES ('*', 'journal.pruned', "
        "jsonb_build_object('before', now() + interval '1 day')) RETURNING id"
    ).fetchone()
    conn.execute("SELECT set_config('outbox.journal_prune', %s, true)", [str(event_id)])
    with pytest.raises(REFUSED, match="append-only"):
        conn.execute("DELETE FROM outbox.journal WHERE event = 'x'")
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM outbox.journal WHERE event = 'x'").fetchone() == (1,)


def test_a_prune_and_the_making_of_a_day_ahead_at_once_do_not_deadlock(db_url):
    """The interleaving a soak met: the prune has read the default partition and writes its
    journal.pruned event (held up here by a lock on today's partition) while the
    maintenance attaches a day ahead: the attach holds the journal and waits for the
    default, which the prune read; the prune's drop then waits for the journal. Without one
    lock for the two, PostgreSQL ended one of them as a deadlock."""
    with psycopg.connect(db_url) as conn:
        days_ahead(conn)
        day = today(conn)
        old = make_day(conn, day - timedelta(days=40))
        conn.execute(f"DROP TABLE outbox.{day_name(day + timedelta(days=2))}")  # to attach
        conn.commit()
    with (
        psycopg.connect(db_url) as holder,
        psycopg.connect(db_url, autocommit=True) as pruner,
        psycopg.connect(db_url, autocommit=True) as maker,
        psycopg.connect(db_url, autocommit=True) as watch,
    ):
        holder.execute(f"LOCK TABLE outbox.{day_name(day)} IN SHARE MODE")
        outcomes: dict[str, Any] = {}

        def call(name: str, conn: psycopg.Connection[Any], query: str) -> None:
            try:
                outcomes[name] = conn.execute(query).fetchone()
            except psycopg.Error as err:
                outcomes[name] = err

        def waiting(conn: psycopg.Connection[Any]) -> bool:
            return bool(
                watch.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    [conn.info.backend_pid],
                ).fetchone()[0]
            )

        prune = threading.Thread(
            target=call, args=("prune", pruner, "SELECT outbox.prune_journal(interval '30 days')")
        )
        prune.start()
        wait_until(lambda: waiting(pruner), what="the prune to wait to write its event")
        make = threading.Thread(
            target=call, args=("make", maker, "SELECT outbox.journal_partitions_v1(2)")
        )
        make.start()
        wait_until(
            lambda: "make" in outcomes or waiting(maker),
            what="the maintenance to make its day or wait",
        )
        holder.rollback()  # the prune writes its event and drops the old day
        prune.join(30)
        make.join(30)
    assert not isinstance(outcomes["prune"], psycopg.Error), outcomes
    assert not isinstance(outcomes["make"], psycopg.Error), outcomes
    with psycopg.connect(db_url) as conn:
        assert old not in partitions(conn)
        # What the maintenance did not make while the prune ran, its next round makes.
        conn.execute("SELECT outbox.journal_partitions_v1(2)")
        conn.commit()
        assert day_name(day + timedelta(days=2)) in partitions(conn)
