"""The soak: steady agent traffic for a while, retention at a short age, a long reader
transaction now and then; per period, what a DBA watches over months.

``python -m bench.soak --minutes 30 [--out DIR]`` (``make soak`` runs it through the soak
test) drives a relay in this process against the scripted model and fake tools: runs with two
parallel tool calls, plain answers, client tools and calls that wait for an approval, over
both model APIs, a fifth of them continuing an earlier thread. The relay's maintenance
retains idle conversations at ``retention_age_s`` (archived, and for the tenant ``globex``
deleted). Every ``reader_every_s`` a reader holds a REPEATABLE READ transaction open for
``reader_hold_s`` (what a long report or a forgotten psql session does to vacuum).

Each period it records runs completed, the claim's p99 (the relay's own claim statement,
timed around the call: the time a worker waits for work to be handed out), autovacuum runs,
and for every table of the schema its live and dead tuples and size, for every index its
size. ``write_report`` writes them as a markdown table (``soak.md``) and, with matplotlib
(the bench extra), a chart beside it (``soak.png``).

Nothing is lost: at the end every run started is accounted for (in the hot tables, in the
archive, or in a ``thread.retained`` event of a deleted conversation) and has completed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import random
import statistics
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql

from outbox import approvals, db, lifecycle, registry, retention, writer
from outbox.constants import ENDED
from outbox.errors import OutboxError
from outbox.relay.config import RelayConfig
from outbox.relay.worker import Worker
from outbox.schemas import StartRun
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService

TENANTS = ("acme", "globex")  # acme archives, globex deletes
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "tools": [
        {
            "tool_calls": [
                {"name": "create_ticket", "arguments": {"title": "broken order"}},
                {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "sorry"}},
            ]
        },
        {"text": "both done"},
    ],
    "client": [{"tool_calls": [{"name": "confirm", "arguments": {"ok": True}}]}, {"text": "ok"}],
    "plain": [{"text": "hello"}],
    "approval": [
        {"tool_calls": [{"name": "refund", "arguments": {"amount": 1}}]},
        {"text": "refunded"},
    ],
}
CONTINUE_SHARE = 0.2  # runs that continue an earlier thread
SIZES = """
SELECT c.relname, c.relkind::text, coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       pg_total_relation_size(c.oid), coalesce(s.autovacuum_count, 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = 'outbox' AND c.relkind IN ('r', 'i') AND NOT c.relispartition
  AND c.relname <> 'alembic_version'
"""


# A partitioned table (the archive, the journal) through its partitions.
PARTITIONED_SIZE = """
SELECT coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint,
       coalesce(sum(pg_total_relation_size(p.relid)), 0)::bigint,
       coalesce(sum(s.autovacuum_count), 0)::bigint
FROM pg_partition_tree(%s::regclass) p
LEFT JOIN pg_stat_user_tables s ON s.relid = p.relid
"""
PARTITIONED = ("archived_runs", "journal")


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 30.0
    period_s: float = 60.0  # one row of the report
    rate: float = 4.0  # runs started per second
    retention_age_s: float = 60.0
    retention_interval_s: float = 10.0
    reader_every_s: float = 300.0
    reader_hold_s: float = 120.0
    vacuum_each_period: bool = False  # the bounded soak compresses time: vacuum as autovacuum would
    journal_keep_s: float = 600.0  # an operator's `outbox prune --older-than`, every period
    # outbox.journal_partition_width: the soak compresses months into minutes, so its journal
    # is partitioned by the minute (by seconds in the bounded soak) for the prune to drop
    # whole partitions within the run, as days are dropped within months.
    journal_partition_width_s: int = 60


@dataclass
class Period:
    index: int
    at_s: float
    runs_started: int
    runs_completed: int
    claim_p99_ms: float
    claims: int
    autovacuum_runs: int
    reader_open: bool
    hot_runs: int
    archived_runs: int
    tables: dict[str, tuple[int, int, int]]  # name: (live tuples, dead tuples, bytes)
    indexes: dict[str, int]  # name: bytes

    def hot_bytes(self) -> int:
        return sum(t[2] for name, t in self.tables.items() if name != "archived_runs")


@dataclass
class SoakReport:
    config: SoakConfig
    periods: list[Period] = field(default_factory=list)
    started: int = 0
    completed: int = 0
    accounted: int = 0
    not_completed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    refused_continuations: int = 0
    first_retention_period: int | None = None


class Traffic:
    """Starts runs at a steady rate, continues some threads, answers client tools."""

    def __init__(self, url: str, model: ScriptedModel, rate: float) -> None:
        self.url = url
        self.model = model
        self.rate = rate
        self.runs: dict[uuid.UUID, tuple[str, uuid.UUID]] = {}  # run: (tenant, thread)
        self.refused = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()  # no more runs started
        # No more answers: set only once every run has ended, since the runs started last
        # may still wait for a client tool's output or a reviewer.
        self.done = threading.Event()
        self.rng = random.Random(11)

    def start_loop(self) -> None:
        with psycopg.connect(self.url) as conn:
            n = 0
            next_at = time.monotonic()
            while not self.stop.is_set():
                next_at += 1 / self.rate
                self.stop.wait(max(0.0, next_at - time.monotonic()))  # the steady pace
                self._start_one(conn, n)
                n += 1

    def _start_one(self, conn: psycopg.Connection[Any], n: int) -> None:
        tenant = TENANTS[n % 2]
        script = ("tools", "plain", "client", "tools", "approval")[n % 5]
        thread_id = None
        with self.lock:
            mine = [t for (tn, t) in self.runs.values() if tn == tenant]
        if mine and self.rng.random() < CONTINUE_SHARE:
            thread_id = self.rng.choice(mine[-50:])
        try:
            if thread_id is None:
                thread_id = writer.create_thread(conn, tenant).id
            run = writer.start_run(
                conn,
                StartRun(
                    tenant_id=tenant,
                    thread_id=thread_id,
                    model="scripted-1",
                    message=f"script:{script} go",
                    tools=["create_ticket", "send_email", "confirm", "refund"],
                    base_url=self.model.url + "/v1",
                    api="chat" if n % 3 == 0 else "responses",
                ),
            )
            conn.commit()
        except OutboxError:
            conn.rollback()  # the thread is busy, or was retained meanwhile
            with self.lock:
                self.refused += 1
            return
        with self.lock:
            self.runs[run.id] = (tenant, run.thread_id)

    def client_loop(self) -> None:
        """Answers client tools, as a backend would, and approves refunds, as a reviewer."""
        with psycopg.connect(self.url) as conn:
            while not self.done.wait(0.1):  # a backend's poll
                for pending in approvals.list_approvals(conn, "pending"):
                    with contextlib.suppress(OutboxError):
                        approvals.decide(conn, pending["id"], "approve", actor="soak-reviewer")
                    conn.commit()
                conn.commit()
                waiting = conn.execute(
                    "SELECT id, tenant_id FROM outbox.runs WHERE status = 'requires_action'"
                ).fetchall()
                conn.commit()
                for run_id, tenant in waiting:
                    with contextlib.suppress(OutboxError):
                        calls = lifecycle.pending_client_calls(conn, run_id)
                        lifecycle.submit_tool_outputs(
                            conn,
                            tenant,
                            run_id,
                            [{"tool_call_id": c["tool_call_id"], "output": "yes"} for c in calls],
                        )
                    conn.commit()


class DeletedRuns:
    """The runs of conversations retention deleted, read from their thread.retained events
    before the journal's pruning takes those (the soak's own account)."""

    def __init__(self) -> None:
        self.ids: set[uuid.UUID] = set()
        self.last_event = 0

    def collect(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT id, detail FROM outbox.journal WHERE event = 'thread.retained' "
            "AND detail ->> 'mode' = 'delete' AND id > %s ORDER BY id",
            [self.last_event],
        ).fetchall()
        conn.commit()
        for event_id, detail in rows:
            self.ids.update(uuid.UUID(r) for r in detail["runs"])
            self.last_event = event_id


class Reader:
    """Holds a REPEATABLE READ transaction open for ``hold_s`` every ``every_s``."""

    def __init__(self, url: str, every_s: float, hold_s: float) -> None:
        self.url, self.every_s, self.hold_s = url, every_s, hold_s
        self.open = threading.Event()
        self.stop = threading.Event()

    def loop(self) -> None:
        while not self.stop.wait(self.every_s - self.hold_s):
            with psycopg.connect(self.url) as conn:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                conn.execute("SELECT count(*) FROM outbox.runs").fetchone()
                self.open.set()
                self.stop.wait(self.hold_s)
                self.open.clear()
                conn.rollback()


def _partition_width(url: str, width_s: int) -> None:
    """Set the journal's partition width for every later session of the database (the
    relay's, the prune's), as an operator would, and make it apply now: the partitions the
    migration made ahead (a day each) are dropped while still empty, and the new width's are
    made from here on."""
    with psycopg.connect(url, autocommit=True) as conn:
        (name,) = conn.execute("SELECT current_database()").fetchone() or ("",)
        setting = f"{int(width_s)} seconds"
        conn.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET outbox.journal_partition_width = {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Literal(setting)
            )
        )
        conn.execute("SELECT set_config('outbox.journal_partition_width', %s, false)", [setting])
        with conn.transaction():
            ahead = conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'outbox.journal'::regclass "
                "AND c.relname <> 'journal_default' AND (regexp_match("
                "pg_get_expr(c.relpartbound, c.oid), 'TO \\(''([^'']+)''\\)'))[1]"
                "::timestamptz > now()"
            ).fetchall()
            for (part,) in ahead:
                table = psycopg.sql.Identifier("outbox", part)
                empty = conn.execute(
                    psycopg.sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(table)
                ).fetchone()
                if empty and empty[0]:
                    conn.execute(psycopg.sql.SQL("DROP TABLE {}").format(table))
            conn.execute("SELECT outbox.journal_partitions_v1(2)")


def _setup(url: str, service: FakeToolService, age_s: float) -> None:
    service.add_tool("refund", "key")
    with psycopg.connect(url) as conn:
        for name, mode in (("create_ticket", "lookup"), ("send_email", "key"), ("refund", "key")):
            spec: dict[str, Any] = {
                "name": name,
                "executor": "http",
                "endpoint": service.endpoint(name),
                "idempotency_mode": mode,
                "timeout_s": 5.0,
            }
            if mode == "lookup":
                spec["lookup_endpoint"] = service.lookup_endpoint(name)
            if name == "refund":
                spec["requires_approval"] = True
            registry.register(conn, registry.ToolSpec(**spec))
        registry.register(
            conn,
            registry.ToolSpec(name="confirm", executor="client", json_schema={"type": "object"}),
        )
        from datetime import timedelta

        age = timedelta(seconds=age_s)
        retention.set_policy(conn, "*", age, mode="archive", actor="soak")
        retention.set_policy(conn, "globex", age, mode="delete", actor="soak")
        conn.commit()


def _timed_claims(worker: Worker, durations: list[float]) -> None:
    """Time the relay's own claim statement (the instance's method, wrapped)."""
    claim = worker._claim

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return claim(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - started)

    worker._claim = timed  # type: ignore[method-assign]


def _snapshot(conn: psycopg.Connection[Any]) -> tuple[dict[str, Any], int]:
    rows = conn.execute(SIZES).fetchall()
    parted = {
        name: conn.execute(PARTITIONED_SIZE, [f"outbox.{name}"]).fetchone() for name in PARTITIONED
    }
    conn.commit()
    tables = {r[0]: (r[2], r[3], r[4]) for r in rows if r[1] == "r"}
    for name, size in parted.items():
        if size is not None:
            tables[name] = (size[0], size[1], size[2])
    indexes = {r[0]: r[4] for r in rows if r[1] == "i"}
    autovacuums = sum(r[5] for r in rows) + sum(p[3] for p in parted.values() if p is not None)
    return {"tables": tables, "indexes": indexes}, autovacuums


def _completed(conn: psycopg.Connection[Any], deleted: DeletedRuns) -> int:
    """Runs completed so far: in the hot tables, archived, or deleted (every run of a
    deleted conversation had ended; the soak's runs all complete, which the end checks)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM outbox.runs WHERE status = 'completed')"
        " + (SELECT count(*) FROM outbox.archived_runs WHERE status = 'completed')"
    ).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0]) + len(deleted.ids)


def run_soak(url: str, cfg: SoakConfig, log: Any = None) -> SoakReport:
    """Run the soak against the database at ``url`` (migrated, empty); returns the report."""
    say = log or (lambda _msg: None)
    report = SoakReport(cfg)
    with ScriptedModel(scripts=SCRIPTS) as model, FakeToolService() as service:
        _partition_width(url, cfg.journal_partition_width_s)
        _setup(url, service, cfg.retention_age_s)
        worker = Worker(
            RelayConfig(
                database_url=url,
                concurrency=64,
                lease_s=10.0,
                poll_interval_s=0.5,
                retention_interval_s=cfg.retention_interval_s,
            )
        )
        durations: list[float] = []
        _timed_claims(worker, durations)
        deleted = DeletedRuns()
        traffic = Traffic(url, model, cfg.rate)
        reader = Reader(url, cfg.reader_every_s, cfg.reader_hold_s)
        threads = [
            threading.Thread(target=worker.run, name="soak-relay"),
            threading.Thread(target=traffic.start_loop, name="soak-starts"),
            threading.Thread(target=traffic.client_loop, name="soak-client"),
            threading.Thread(target=reader.loop, name="soak-reader"),
        ]
        for t in threads:
            t.start()
        began = time.monotonic()
        try:
            with psycopg.connect(url) as conn:
                _, autovacuums = _snapshot(conn)
                completed_before = 0
                deadline = began + cfg.minutes * 60
                index = 0
                while time.monotonic() < deadline:
                    index += 1
                    time.sleep(max(0.0, began + index * cfg.period_s - time.monotonic()))
                    deleted.collect(conn)
                    _prune_journal(url, cfg.journal_keep_s)
                    if cfg.vacuum_each_period:
                        _vacuum(url)
                    sizes, av = _snapshot(conn)
                    claims, durations[:] = list(durations), []
                    completed = _completed(conn, deleted)
                    hot = conn.execute("SELECT count(*) FROM outbox.runs").fetchone()
                    archived = conn.execute(
                        "SELECT count(*) FROM outbox.archived_runs WHERE run_id IS NOT NULL"
                    ).fetchone()
                    conn.commit()
                    with traffic.lock:
                        started = len(traffic.runs)
                    period = Period(
                        index=index,
                        at_s=round(time.monotonic() - began, 1),
                        runs_started=started,
                        runs_completed=completed - completed_before,
                        claim_p99_ms=_p99_ms(claims),
                        claims=len(claims),
                        autovacuum_runs=av - autovacuums,
                        reader_open=reader.open.is_set(),
                        hot_runs=hot[0] if hot else 0,
                        archived_runs=archived[0] if archived else 0,
                        **sizes,
                    )
                    report.periods.append(period)
                    retained = (archived[0] if archived else 0) + len(deleted.ids)
                    if report.first_retention_period is None and retained:
                        report.first_retention_period = index
                    completed_before, autovacuums = completed, av
                    say(
                        f"period {index}: {period.runs_completed} completed, hot runs "
                        f"{period.hot_runs}, hot bytes {period.hot_bytes()}, claim p99 "
                        f"{period.claim_p99_ms} ms, autovacuums {period.autovacuum_runs}"
                    )
        finally:
            traffic.stop.set()
            reader.stop.set()
            threads[1].join()
            threads[3].join()
        try:
            _drain(url, traffic, report, deleted)
        finally:
            traffic.done.set()
            threads[2].join()
        worker.stop()
        threads[0].join(timeout=60)
    return report


def _prune_journal(url: str, keep_s: float) -> None:
    """What an operator's cron does: ``outbox prune --older-than`` (the accounts of retained
    conversations, thread.retained, go with it)."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT outbox.prune_journal(make_interval(secs => %s), 'soak')", [keep_s])
        conn.commit()


def _vacuum(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "VACUUM (ANALYZE) outbox.outbox, outbox.runs, outbox.threads, "
            "outbox.messages, outbox.tool_calls, outbox.tool_results, "
            "outbox.tool_batches, outbox.submissions, outbox.model_turns, "
            "outbox.journal, outbox.responses"
        )


def _p99_ms(durations: list[float]) -> float:
    if len(durations) < 2:
        return round(1000 * durations[0], 2) if durations else 0.0
    return round(1000 * statistics.quantiles(durations, n=100)[98], 2)


def _drain(
    url: str, traffic: Traffic, report: SoakReport, deleted: DeletedRuns, timeout_s: float = 120.0
) -> None:
    """Wait until every run started has ended (the relay and the client loop still run),
    then account for each one."""
    ids = list(traffic.runs)
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url) as conn:
        while time.monotonic() < deadline:
            open_runs = conn.execute(
                "SELECT count(*) FROM outbox.runs WHERE id = ANY(%s) AND NOT status = ANY(%s)",
                [ids, list(ENDED)],
            ).fetchone()
            conn.commit()
            if open_runs and open_runs[0] == 0:
                break
            time.sleep(0.2)  # polling for the end of the traffic, with a deadline
        status: dict[uuid.UUID, str] = {}
        for run_id, st in conn.execute(
            "SELECT id, status FROM outbox.runs WHERE id = ANY(%s)", [ids]
        ).fetchall():
            status[run_id] = st
        for run_id, st in conn.execute(
            "SELECT run_id, status FROM outbox.archived_runs WHERE run_id = ANY(%s)", [ids]
        ).fetchall():
            status[run_id] = st
        conn.commit()
        deleted.collect(conn)
        for rid in deleted.ids:
            # a deleted conversation keeps no status: its runs had all ended (retain_v1)
            status.setdefault(rid, "completed (deleted)")
    report.started = len(ids)
    report.refused_continuations = traffic.refused
    report.accounted = sum(1 for r in ids if r in status)
    report.lost = [str(r) for r in ids if r not in status]
    report.not_completed = [
        f"{r}: {status[r]}" for r in ids if r in status and not status[r].startswith("completed")
    ]
    report.completed = report.accounted - len(report.not_completed)


HOT = (
    "outbox",
    "runs",
    "threads",
    "messages",
    "tool_calls",
    "tool_results",
    "journal",
    "archived_runs",
)


def write_report(report: SoakReport, out: Path) -> list[Path]:
    """``soak.md`` (a table per period), ``soak.json`` (every figure) and, with matplotlib,
    ``soak.png`` beside them."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Soak",
        "",
        f"{report.config.minutes:g} min, {report.config.rate:g} runs/s, retention age "
        f"{report.config.retention_age_s:g} s, reader held {report.config.reader_hold_s:g} s "
        f"every {report.config.reader_every_s:g} s; first retention in period "
        f"{report.first_retention_period}.",
        "",
        f"Runs started {report.started}, accounted for {report.accounted}, completed "
        f"{report.completed}, lost {len(report.lost)}; continuations refused (thread busy or "
        f"retained) {report.refused_continuations}.",
        "",
        "| period | at s | completed | claim p99 ms | autovacuums | reader | hot runs | archived "
        "| " + " | ".join(f"{t} live/dead/kB" for t in HOT) + " | hot bytes |",
        "|" + "---|" * (10 + len(HOT)),
    ]
    for p in report.periods:
        cells = [
            f"{p.tables.get(t, (0, 0, 0))[0]}/{p.tables.get(t, (0, 0, 0))[1]}/"
            f"{p.tables.get(t, (0, 0, 0))[2] // 1024}"
            for t in HOT
        ]
        lines.append(
            f"| {p.index} | {p.at_s} | {p.runs_completed} | {p.claim_p99_ms} | "
            f"{p.autovacuum_runs} | {'open' if p.reader_open else ''} | {p.hot_runs} | "
            f"{p.archived_runs} | " + " | ".join(cells) + f" | {p.hot_bytes()} |"
        )
    if report.periods:
        last = report.periods[-1]
        lines += ["", "Index sizes in the last period (bytes):", ""]
        lines += [f"- {name}: {size}" for name, size in sorted(last.indexes.items())]
    md = out / "soak.md"
    md.write_text("\n".join(lines) + "\n")
    raw = out / "soak.json"
    raw.write_text(json.dumps(asdict(report), indent=1))
    written = [md, raw]
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return written
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    periods = [p.index for p in report.periods]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    axes[0][0].plot(periods, [p.runs_completed for p in report.periods], marker="o")
    axes[0][0].set_title("runs completed per period")
    axes[0][1].plot(periods, [p.claim_p99_ms for p in report.periods], marker="o")
    axes[0][1].set_title("claim p99 (ms)")
    for t in HOT:
        axes[1][0].plot(
            periods, [p.tables.get(t, (0, 0, 0))[2] / 1024 for p in report.periods], label=t
        )
        axes[1][1].plot(periods, [p.tables.get(t, (0, 0, 0))[1] for p in report.periods], label=t)
    axes[1][0].set_title("table size with indexes (kB)")
    axes[1][1].set_title("dead tuples")
    axes[1][0].legend(fontsize=7)
    for ax in (a for row in axes for a in row):
        ax.set_xlabel("period")
        for p in report.periods:
            if p.reader_open:
                ax.axvspan(p.index - 0.5, p.index + 0.5, color="grey", alpha=0.15)
    fig.suptitle("agent-outbox soak (grey: a long reader transaction open)")
    fig.tight_layout()
    png = out / "soak.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return [*written, png]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=4.0, help="runs started per second")
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak"))
    args = parser.parse_args(argv)
    url = db.database_url(start=True)
    report = run_soak(url, SoakConfig(minutes=args.minutes, rate=args.rate), log=print)
    for path in write_report(report, args.out):
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
