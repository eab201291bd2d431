"""The trace exporter's windows: killed between its export and its commit, two at once,
started after the runs ended, refused by its backend.

Runs end cheaply here: started and cancelled by the backend (an ended run, its span due),
or, where attempts' spans matter, completed by a relay thread that names them (tracing
installed in this process, as ``tests/integration/test_traces.py`` does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from outbox import lifecycle, trace_context, trace_export
from outbox.testing.relay import stop_relay
from tests.helpers import new_run
from tests.integration.test_traces import finish, start

# The fixtures of test_traces, used here by name.
from tests.integration.test_traces import model as model
from tests.integration.test_traces import service as service
from tests.integration.test_traces import setup as setup
from tests.otlp_receiver import otlp_receiver
from tests.relay_harness import REPO, scalar, start_relay_process, wait_until

TENANT = "acme"
DUE = "SELECT count(*) FROM outbox.runs WHERE agent_span_due"
LEASE_S = 2.0  # the killed exporter's lease on its batch


@pytest.fixture
def named_attempts() -> Iterator[None]:
    """Tracing installed here: the relay thread names each attempt's span and journals it."""
    trace_context.install(InMemorySpanExporter(), batch=False)
    yield
    trace_context.shutdown()


def cancelled_runs(db_url: str, n: int) -> list[uuid.UUID]:
    with psycopg.connect(db_url) as conn:
        runs = [new_run(conn).id for _ in range(n)]
        for run_id in runs:
            lifecycle.cancel_run(conn, run_id, TENANT, actor="backend-svc")
        conn.commit()
    return runs


def ids(found: Sequence[Any]) -> set[tuple[str, int, int]]:
    """(name, trace id, span id) of SDK spans or received OTLP spans."""
    out = set()
    for s in found:
        if isinstance(s, ReadableSpan):
            assert s.context is not None
            out.add((s.name, s.context.trace_id, s.context.span_id))
        else:
            out.add((s.name, s.trace_id, s.span_id))
    return out


KILLED_AFTER_EXPORT = """
import os, signal, sys
import psycopg
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from outbox import trace_export
with psycopg.connect(sys.argv[1]) as conn:
    trace_export.export_due(
        conn,
        [OTLPSpanExporter(endpoint=sys.argv[2])],
        after_export=lambda: os.kill(os.getpid(), signal.SIGKILL),
        lease_s=float(sys.argv[3]),
    )
"""


def test_an_exporter_killed_after_its_export_loses_nothing_and_exports_the_same_spans_again(
    setup, model, service, named_attempts
):
    """kill -9 between the export and the clearing of the marks: the marks stay, no other
    exporter takes the runs while the dead one's lease lasts, and after it the next pass
    exports the very same spans (same names, same ids); a pass after that, none."""
    run = start(setup, model)
    finish(setup, run.id)
    cancelled = cancelled_runs(setup, 3)
    assert scalar(setup, DUE) == 4
    with otlp_receiver() as receiver:
        died = subprocess.run(
            [
                sys.executable,
                "-c",
                KILLED_AFTER_EXPORT,
                setup,
                receiver.endpoint + "/v1/traces",
                str(LEASE_S),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        first = receiver.received()
    assert died.returncode == -9
    assert len(first) == 5 + 3  # the run's invoke_agent, 2 chat, 2 execute_tool; 3 cancelled
    assert scalar(setup, DUE) == 4  # nothing was committed: every run is still due
    again = InMemorySpanExporter()
    with psycopg.connect(setup) as conn:
        assert trace_export.lag(conn)["due"] == 4
        leased = scalar(setup, "SELECT count(*) FROM outbox.runs WHERE spans_taken_until > now()")
        if leased:  # the dead exporter's lease still runs: nobody takes its runs yet
            assert trace_export.export_due(conn, [again]).runs == 0
        wait_until(
            lambda: trace_export.export_due(conn, [again]).runs == 4,
            what="the dead exporter's lease to run out and its runs to be exported again",
        )
        assert trace_export.export_due(conn, [again]).runs == 0
    assert ids(again.get_finished_spans()) == ids(first)
    assert {s.attributes["outbox.run.id"] for s in first if s.name == "invoke_agent"} == {
        str(r) for r in [run.id, *cancelled]
    }
    assert scalar(setup, DUE) == 0


class Meeting(InMemorySpanExporter):
    """Holds its first export until the other exporter is in the middle of one too."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier
        self.met = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self.met:
            self.met = True
            self.barrier.wait(timeout=20)  # both hold a batch, uncommitted, at once
        return super().export(spans)


def test_two_exporters_at_once_export_each_run_once(db_url):
    runs = cancelled_runs(db_url, 20)
    barrier = threading.Barrier(2)
    exporters = [Meeting(barrier), Meeting(barrier)]
    failures: list[BaseException] = []

    def drain(exporter: Meeting) -> None:
        try:
            with psycopg.connect(db_url) as conn:
                while trace_export.export_due(conn, [exporter], limit=5).runs:
                    pass
        except BaseException as err:  # reported below, in the test's thread
            failures.append(err)

    threads = [threading.Thread(target=drain, args=(e,)) for e in exporters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    exported = [s.attributes["outbox.run.id"] for e in exporters for s in e.get_finished_spans()]
    assert all(e.get_finished_spans() for e in exporters)  # both took a share
    assert sorted(exported) == sorted(str(r) for r in runs)  # each run once, none lost
    assert scalar(db_url, DUE) == 0


def test_an_exporter_started_after_the_runs_ended_exports_them(
    setup, model, service, named_attempts
):
    """The runs ran and ended with no exporter anywhere; `outbox traces export --once`,
    started afterwards, exports their whole traces over OTLP."""
    first, second = start(setup, model), start(setup, model)
    finish(setup, first.id)
    finish(setup, second.id)
    with otlp_receiver() as receiver:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "OUTBOX_DATABASE_URL": setup,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        }
        done = subprocess.run(
            [sys.executable, "-m", "outbox.commands", "traces", "export", "--once"],
            cwd=REPO,
            env=env,
            timeout=120,
            capture_output=True,
        )
        assert done.returncode == 0, done.stderr.decode()
        received = receiver.received()
    for run in (first, second):
        trace_id = trace_context.own_trace_id(run.id)
        mine = [s for s in received if s.trace_id == trace_id]
        assert sorted(s.name for s in mine) == [
            "chat scripted-1",
            "chat scripted-1",
            "execute_tool create_ticket",
            "execute_tool send_email",
            "invoke_agent",
        ]
        assert all(
            s.parent_span_id == trace_context.agent_span_id(run.id)
            for s in mine
            if s.name != "invoke_agent"
        )
        assert {s.service for s in mine} == {"outbox-relay"}
    assert scalar(setup, DUE) == 0


class Refusing(InMemorySpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE


def test_an_export_that_fails_leaves_the_runs_due(db_url):
    cancelled_runs(db_url, 2)
    with psycopg.connect(db_url) as conn, pytest.raises(trace_export.ExportFailed):
        trace_export.export_due(conn, [Refusing()])
    assert scalar(db_url, DUE) == 2
    spans = InMemorySpanExporter()
    with psycopg.connect(db_url) as conn:
        assert trace_export.export_due(conn, [spans]).runs == 2
    assert len(spans.get_finished_spans()) == 2


def test_a_run_whose_journal_was_pruned_before_export_keeps_its_run_span_and_is_counted(
    setup, model, service, named_attempts
):
    """The journal's events of a run gone before the exporter came (a prune past the
    exporter's lag): its invoke_agent span is still built from its row, its attempts'
    spans are lost, and the exporter counts the run."""
    pruned, kept = start(setup, model), start(setup, model)
    finish(setup, pruned.id)
    finish(setup, kept.id)
    with psycopg.connect(setup) as conn:
        # As a prune would: past the journal's guard (the test's login owns the schema).
        conn.execute("SET session_replication_role = replica")
        conn.execute("DELETE FROM outbox.journal WHERE run_id = %s", [pruned.id])
        conn.commit()
    spans = InMemorySpanExporter()
    with psycopg.connect(setup) as conn:
        done = trace_export.export_due(conn, [spans])
    assert (done.runs, done.pruned) == (2, 1)
    by_trace: dict[int, list[str]] = {}
    for s in spans.get_finished_spans():
        assert s.context is not None
        by_trace.setdefault(s.context.trace_id, []).append(s.name)
    assert by_trace[trace_context.own_trace_id(pruned.id)] == ["invoke_agent"]
    assert len(by_trace[trace_context.own_trace_id(kept.id)]) == 5


class Held(InMemorySpanExporter):
    """An export that waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = threading.Event()
        self.go = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.inside.set()
        assert self.go.wait(timeout=30)
        return super().export(spans)


def test_an_export_in_progress_holds_no_row_of_its_runs(db_url):
    """While its collector takes its time, an exporter holds no lock on its runs' rows (a
    completer writing a late result of one, retention, a cancel would wait), and its lease
    keeps them from a second exporter."""
    (run_id,) = cancelled_runs(db_url, 1)
    slow = Held()
    done: list[trace_export.Exported] = []

    def export() -> None:
        with psycopg.connect(db_url) as conn:
            done.append(trace_export.export_due(conn, [slow]))

    exporting = threading.Thread(target=export)
    exporting.start()
    try:
        assert slow.inside.wait(timeout=30)
        with psycopg.connect(db_url) as conn:
            conn.execute("SET lock_timeout = '2s'")
            locked = conn.execute(
                "SELECT id FROM outbox.runs WHERE id = %s FOR UPDATE", [run_id]
            ).fetchall()
            assert locked == [(run_id,)]
            conn.rollback()
            assert trace_export.export_due(conn, [InMemorySpanExporter()]).runs == 0  # leased
    finally:
        slow.go.set()
        exporting.join(timeout=30)
    assert [d.runs for d in done] == [1]
    assert scalar(db_url, DUE) == 0


def exporters_of(pid: int) -> list[int]:
    """The pids of the `outbox traces export` processes that process ``pid`` started."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):  # gone since
                command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                if b"traces" in command and b"export" in command:
                    found.append(int(child))
    return found


def test_a_relays_exporter_that_dies_is_started_again(db_url, tmp_path: Path):
    """The exporter a relay started, killed with -9, is replaced, and the new one exports:
    without it the ended runs' spans would wait, seen only by the lag gauge."""
    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        log = tmp_path / "relay.log"
        relay = start_relay_process(db_url, log, "--kind", "tool_call", env=env)
        try:
            wait_until(lambda: exporters_of(relay.pid), what="the relay's trace exporter")
            (first,) = exporters_of(relay.pid)
            os.kill(first, signal.SIGKILL)
            wait_until(
                lambda: exporters_of(relay.pid) not in ([], [first]),
                what="the relay to start its exporter again",
            )
            runs = cancelled_runs(db_url, 2)
            wait_until(
                lambda: (
                    {trace_context.own_trace_id(r) for r in runs}
                    <= {s.trace_id for s in receiver.received() if s.name == "invoke_agent"}
                ),
                what="the new exporter to export the runs ended since",
            )
        finally:
            stop_relay(relay)
    assert "traces.exporter_restarted" in log.read_text()
