"""``outbox demo``: replay the duplicate-ticket incident under faults, through the outbox and
through a naive coordinator, and print what each side's services actually did.

What runs (all local, all real):

- a fresh database ``outbox_demo`` on the configured server (dropped and re-created, then
  migrated), so repeated runs are independent and nothing else is touched;
- the scripted OpenAI-compatible model and three audited tool services as HTTP servers in
  this process (``demo.incident``);
- P relay processes (``python -m outbox.commands relay``), each a separate interpreter the demo can
  ``kill -9`` and start again;
- in this process, the user's clients (N conversations paced over time, some turns sent
  twice concurrently with one idempotency key), a backend thread answering the client-run
  ``approve_refund`` through ``lifecycle.pending_client_calls`` / ``submit_tool_outputs``
  (some outputs sent twice), and the fault schedule: stalls past the tool timeout, kills,
  and duplicate callbacks and polls (``writer.record_tool_result`` and
  ``writer.deliver_batch`` re-invoked for work that is done: each must be a no-op).

Then the same scenario, seed and fault schedule run through ``demo.naive``. The report
counts side effects and duplicates from the services' own audits, replays every stored
thread (``history.replay`` must repair nothing; the scripted model, as strict as OpenAI,
must accept it), and exits non-zero when the outbox side shows a duplicate, an orphan, a
rejected history or a stuck run. Design choice: the demo drives the library exactly as a
backend would (writer, lifecycle) and never reaches into relay internals; what it proves
is what a user gets.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import openai
import psutil
import psycopg
from psycopg.rows import dict_row

from demo import incident
from demo.incident import (
    CLIENT_TOOL,
    MODEL,
    TENANT,
    TOOL_TIMEOUT_S,
    Conversation,
    Scenario,
    ServiceAudit,
    Services,
)
from demo.naive import NaiveCoordinator, error_message, history_problems
from outbox import constants, db, history, lifecycle, migrate, registry, statements, writer
from outbox.errors import OutboxError
from outbox.schemas import StartRun, ToolResultIn
from outbox.sql import Queries
from outbox.testing.relay import FAST_ARGS, relay_workers, start_relay, stop_relay, wait_until

T = TypeVar("T")
DEMO_DATABASE = "outbox_demo"
RELAY_ARGS = (*FAST_ARGS, "--grace", "3", "--log-level", "WARNING")
RELAY_READY_S = 60.0  # seconds the relay processes get to connect
TAIL_S = 60.0  # seconds after the last arrival for every run to end
NAIVE_TAIL_S = 35.0  # the naive side's equivalent (its turns give up after 30 s)
POLL_S = 0.1  # seconds between two polls of a condition (backend, progress)
DUPLICATE_CALLBACKS_PER_TICK = 4  # re-invocations per 0.25 s tick in the fault window
RE_REPORTED, RE_POLLED = "tool results re-reported", "batch deliveries re-polled"  # report keys
TICK_S = 0.25  # seconds between two duplicate-callback ticks
TOOL_MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class DemoConfig:
    """What ``outbox demo`` runs; ``server_url`` None = OUTBOX_DATABASE_URL or embedded."""

    runs: int = 200
    processes: int = 3
    seed: int = 7
    server_url: str | None = None
    database: str = DEMO_DATABASE
    naive: bool = True
    progress: bool = True


@dataclass
class SideReport:
    """One side's figures, each from its ground truth (services' audits, stored history)."""

    name: str
    conversations: int = 0
    double_submitted: int = 0
    runs: dict[str, int] = field(default_factory=dict)  # by status
    tool_calls: dict[str, int] = field(default_factory=dict)
    services: dict[str, ServiceAudit] = field(default_factory=dict)
    threads_replayed: int = 0
    orphan_results: int = 0  # tool results in stored histories without their call
    duplicate_outputs: int = 0  # a call answered twice in a stored history
    repaired_threads: int = 0  # threads history.replay had to repair
    rejected_threads: int = 0  # threads the scripted model refuses (bricked)
    rejections: dict[str, int] = field(default_factory=dict)  # by error message shape
    stuck_requires_action: int = 0
    unfinished: int = 0  # still active at the deadline
    runs_per_turn_violations: int = 0  # a turn that made more than one run
    quarantined: dict[str, int] = field(default_factory=dict)  # "tool status: reason" -> n
    kept_out_of_history: dict[str, int] = field(default_factory=dict)  # orphaned_results
    injected: dict[str, int] = field(default_factory=dict)  # faults and duplicates sent
    noop_violations: int = 0  # duplicate callbacks that changed something
    latency_p50_s: float | None = None
    latency_p95_s: float | None = None
    elapsed_s: float = 0.0

    def duplicates(self, kind: str = "request") -> int:
        return sum(
            a.duplicates_same_request if kind == "request" else a.duplicates_same_call
            for a in self.services.values()
        )

    def effects(self) -> int:
        return sum(a.effects for a in self.services.values())

    def clean(self) -> bool:
        """No duplicate, orphan, bricked thread or stuck run: the outbox's promise."""
        return not (
            self.duplicates("request")
            or self.duplicates("call")
            or self.orphan_results
            or self.duplicate_outputs
            or self.repaired_threads
            or self.rejected_threads
            or self.stuck_requires_action
            or self.unfinished
            or self.runs_per_turn_violations
            or self.noop_violations
        )

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["services"] = {k: v.to_json() for k, v in self.services.items()}
        data["duplicate_side_effects"] = self.duplicates("request")
        data["duplicate_side_effects_same_call"] = self.duplicates("call")
        data["side_effects"] = self.effects()
        data["clean"] = self.clean()
        return data


# -- progress on stderr -------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (redrawn on a terminal, a few lines otherwise)."""

    WIDTH = 30  # characters

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self.label, self.total, self.enabled = label, max(1, total), enabled
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self.last_tenth = -1

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        share = min(1.0, done / self.total)
        filled = int(share * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = (
            f"{self.label:8} [{bar}] {done:4}/{self.total} "
            f"{time.monotonic() - self.started:5.1f}s {note}"
        )
        if self.tty:
            sys.stderr.write("\r" + line.ljust(100)[:100])
            sys.stderr.flush()
        elif int(share * 10) != self.last_tenth:
            self.last_tenth = int(share * 10)
            sys.stderr.write(line + "\n")

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


# -- the database and the relay fleet -------------------------------------------------------


def prepare_database(server_url: str, name: str) -> str:
    """Drop and re-create database ``name`` on the server, migrate it; returns its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db.quote_ident(name)} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {db.quote_ident(name)}")
    url = db.with_database(server_url, name)
    migrate.upgrade(url)
    return url


def register_tools(url: str, services: Services) -> None:
    string = {"type": "string"}
    schemas: dict[str, dict[str, Any]] = {
        "create_ticket": {"properties": {"title": string}, "required": ["title"]},
        "send_email": {"properties": {"to": string, "subject": string}, "required": ["to"]},
        "charge": {"properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
    }
    with db.connect(url) as conn:
        for tool, schema in schemas.items():
            mode = "lookup" if tool == "create_ticket" else "key"
            registry.register(
                conn,
                registry.ToolSpec(
                    name=tool,
                    json_schema={"type": "object", **schema},
                    endpoint=services.endpoint(tool),
                    lookup_endpoint=services.lookup_endpoint(tool) if mode == "lookup" else None,
                    idempotency_mode=mode,
                    # What the services declare of a request they are acting on: a key tool
                    # refuses a key in use (409), so a resend needs no wait for it to settle.
                    refuses_key_in_use=mode == "key",
                    timeout_s=TOOL_TIMEOUT_S,
                    max_attempts=TOOL_MAX_ATTEMPTS,
                ),
            )
        registry.register(
            conn,
            registry.ToolSpec(
                name=CLIENT_TOOL, executor="client", description="a human approves the refund"
            ),
        )
        conn.commit()


class RelayFleet:
    """One ``outbox relay --processes P``: P worker processes under their supervisor, as an
    operator runs them. The demo ``kill -9``s a worker; the supervisor starts another and
    ends the dead worker's leases, so its rows run again without waiting out the lease."""

    def __init__(self, url: str, processes: int, log_path: Path) -> None:
        self.url = url
        self.processes = processes
        self.kills = 0
        self.supervisor = start_relay(
            url, "--processes", str(processes), *RELAY_ARGS, log_path=log_path
        )
        self.log_path = log_path

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index`` (no cleanup, leases left behind); its supervisor starts
        another."""
        workers = relay_workers(self.supervisor.pid)
        if not workers:
            return
        victim = workers[index % len(workers)]
        with contextlib.suppress(psutil.Error):
            victim.kill()
            victim.wait(timeout=10)
            self.kills += 1

    def wait_ready(self, q: Queries) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:

            def ready() -> bool:
                code = self.supervisor.poll()
                if code is not None:
                    raise RuntimeError(
                        f"the relay processes did not start (exit code {code}); see {self.log_path}"
                    )
                row = conn.execute(q.relay_claimers).fetchone()
                return bool(row and row[0] >= self.processes)

            try:
                wait_until(ready, RELAY_READY_S, "the relay processes to start")
            except TimeoutError as err:
                raise RuntimeError(f"{err}; see {self.log_path}") from err

    def stop(self) -> None:
        stop_relay(self.supervisor)  # killed after the wait: its workers notice and stop


# -- the fault schedule ---------------------------------------------------------------------


@contextmanager
def fault_schedule(
    scenario: Scenario, started: float, stall: Callable[[float], None], kill: Callable[[int], None]
) -> Iterator[None]:
    """Run the scenario's fault plan in a thread, paced from ``started`` (monotonic)."""
    stop = threading.Event()
    plan = scenario.faults
    events: list[tuple[float, Callable[[], None]]] = [
        (plan.window_start_s, lambda: stall(plan.window_s))
    ]
    for n, at in enumerate(plan.kill_at_s):
        events.append((at, lambda n=n: kill(n)))  # type: ignore[misc]
    events.sort(key=lambda e: e[0])

    def play() -> None:
        for at, action in events:
            if stop.wait(max(0.0, started + at - time.monotonic())):  # pacing the schedule
                return
            action()

    thread = threading.Thread(target=play, name="faults", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def pace(started: float, conversations: tuple[Conversation, ...]) -> Iterator[Conversation]:
    """Yield each conversation at its arrival time (pacing the load, not a wait for state)."""
    for conv in conversations:
        delay = started + conv.start_at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        yield conv


# -- our side -------------------------------------------------------------------------------


class OurSide:
    """The scenario through the outbox: the user's clients, the backend, the faults."""

    def __init__(self, cfg: DemoConfig, url: str, scenario: Scenario, log_path: Path) -> None:
        self.cfg, self.url, self.scenario = cfg, url, scenario
        self.q = Queries(Path(__file__).parent / "queries" / "demo.sql", db.schema_name())
        self.model = incident.start_model()
        self.services = Services.start()
        register_tools(url, self.services)
        self.fleet = RelayFleet(url, cfg.processes, log_path)
        self.threads: dict[uuid.UUID, Conversation] = {}
        self.created: Counter[str] = Counter()  # start_run: created / deduplicated / refused
        self.injected: Counter[str] = Counter()
        self.noop_violations = 0
        self.stop = threading.Event()
        self.started = 0.0
        self.lock = threading.Lock()

    def close(self) -> None:
        self.stop.set()
        self.fleet.stop()
        self.model.stop()
        self.services.stop()

    def play(self) -> SideReport:
        self.fleet.wait_ready(self.q)
        backend = threading.Thread(target=self._backend, name="backend", daemon=True)
        callbacks = threading.Thread(target=self._duplicate_callbacks, name="dup", daemon=True)
        self.started = time.monotonic()
        backend.start()
        callbacks.start()
        total = len(self.scenario.conversations)
        bar = Progress("outbox", total, self.cfg.progress)
        with (
            fault_schedule(self.scenario, self.started, self._stall, self.fleet.kill),
            ThreadPoolExecutor(8, thread_name_prefix="client") as clients,
        ):
            for conv in pace(self.started, self.scenario.conversations):
                clients.submit(self._user_turn, conv)
                bar.update(self._ended(), "arriving")
        deadline = time.monotonic() + TAIL_S
        while (ended := self._ended()) < total and time.monotonic() < deadline:
            bar.update(ended, "finishing")
            time.sleep(POLL_S)  # polling a condition with a deadline
        bar.update(self._ended(), "done")
        bar.close()
        elapsed = time.monotonic() - self.started
        self.stop.set()
        backend.join()
        callbacks.join()
        report = self._report()
        report.elapsed_s = elapsed
        return report

    def _stall(self, window_s: float) -> None:
        self.services.inject_stalls(window_s)
        self.injected["tool stalls armed (s)"] = round(window_s)

    def _ended(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(self.q.run_progress).fetchone()
        return int(row[1]) if row else 0

    def _user_turn(self, conv: Conversation) -> None:
        with db.connect(self.url) as conn:
            thread = writer.create_thread(conn, TENANT, title=f"order {conv.order}")
            conn.commit()
        with self.lock:
            self.threads[thread.id] = conv
        copies = 2 if conv.double_submit else 1
        barrier = threading.Barrier(copies)

        def send() -> None:
            barrier.wait()  # the two copies of a double submit really race
            self._start_run(conv, thread.id)

        senders = [threading.Thread(target=send) for _ in range(copies)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()

    def _start_run(self, conv: Conversation, thread_id: uuid.UUID) -> None:
        request = StartRun(
            tenant_id=TENANT,
            thread_id=thread_id,
            model=MODEL,
            message=conv.message,
            tools=["create_ticket", "send_email", "charge", CLIENT_TOOL],
            base_url=self.model.url + "/v1",
            idempotency_key=conv.idempotency_key,
        )
        try:
            with db.connect(self.url) as conn:
                run = writer.start_run(conn, request)
                conn.commit()
            outcome = "created" if run.created else "deduplicated"
        except OutboxError as err:  # e.g. ActiveRunExists: refused, never interleaved
            outcome = f"refused ({type(err).__name__})"
        with self.lock:
            self.created[outcome] += 1

    def _backend(self) -> None:
        """The backend: answer approve_refund for runs waiting in requires_action."""
        with db.connect(self.url) as conn:
            while not self.stop.wait(POLL_S):
                try:
                    waiting = statements.fetch_all(conn, self.q.waiting_runs, {})
                    conn.commit()
                    for run in waiting:
                        self._approve(conn, run)
                except psycopg.Error as err:  # keep answering; the report shows the error
                    conn.rollback()
                    with self.lock:
                        self.injected[f"backend errors ({type(err).__name__})"] += 1

    def _approve(self, conn: psycopg.Connection[Any], run: dict[str, Any]) -> None:
        calls = lifecycle.pending_client_calls(conn, run["id"])
        conn.commit()
        if not calls:
            return
        outputs = [
            {"tool_call_id": c["tool_call_id"], "output": {"approved": True, "by": "backend"}}
            for c in calls
        ]
        conv = self.threads.get(run["thread_id"])
        twice = conv is not None and conv.approve_twice
        for copy in range(2 if twice else 1):
            try:
                self._transaction(
                    conn,
                    lambda: lifecycle.submit_tool_outputs(
                        conn, run["tenant_id"], run["id"], outputs
                    ),
                )
            except OutboxError:
                conn.rollback()
                with self.lock:
                    self.noop_violations += copy  # a repeat must be accepted as a no-op
                continue
            if copy:
                with self.lock:
                    self.injected["client outputs re-sent"] += 1

    def _transaction(self, conn: psycopg.Connection[Any], work: Callable[[], T]) -> T:
        """Run ``work`` and commit, again after a deadlock or a serialization failure, as
        any Postgres client must; each retry is counted in the report."""
        while True:
            try:
                done = work()
                conn.commit()
                return done
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as err:
                conn.rollback()
                with self.lock:
                    self.injected[f"transactions retried ({type(err).__name__})"] += 1

    def _duplicate_callbacks(self) -> None:
        """In the fault window: results re-reported and deliveries re-polled for done work,
        each in its own transaction, as a webhook handler or a poller would. Past the
        window, until each kind has happened once: on a slow machine no call may have
        ended inside it, and the report would prove nothing about duplicates."""
        plan = self.scenario.faults
        with db.connect(self.url) as conn:
            while not self.stop.wait(TICK_S):
                elapsed = time.monotonic() - self.started
                if not (plan.in_window(elapsed) or self._owes_duplicates(plan, elapsed)):
                    continue
                n = {"n": DUPLICATE_CALLBACKS_PER_TICK}
                calls = statements.fetch_all(conn, self.q.done_calls_sample, n)
                batches = statements.fetch_all(conn, self.q.delivered_batches_sample, n)
                conn.commit()
                for call in calls:
                    late = ToolResultIn(
                        tenant_id=call["tenant_id"],
                        tool_call_ref=call["id"],
                        status="ok",
                        output={"late_duplicate_callback": True},
                    )
                    stored = self._transaction(conn, partial(writer.record_tool_result, conn, late))
                    self._count(RE_REPORTED, stored.outcome == "duplicate")
                for batch in batches:
                    redo = partial(writer.deliver_batch, conn, batch["id"])
                    delivery = self._transaction(conn, redo)
                    self._count(RE_POLLED, delivery.outcome == "already")

    def _owes_duplicates(self, plan: incident.FaultPlan, elapsed_s: float) -> bool:
        if elapsed_s < plan.window_start_s + plan.window_s:
            return False
        with self.lock:
            return self.injected[RE_REPORTED] == 0 or self.injected[RE_POLLED] == 0

    def _count(self, what: str, noop: bool) -> None:
        with self.lock:
            self.injected[what] += 1
            self.noop_violations += 0 if noop else 1

    # -- the report -------------------------------------------------------------------------

    def _report(self) -> SideReport:
        report = SideReport("outbox")
        report.conversations = len(self.scenario.conversations)
        report.double_submitted = sum(1 for c in self.scenario.conversations if c.double_submit)
        report.services = {
            name: incident.audit(service, incident.SERVICES[name])
            for name, service in self.services.by_name().items()
        }
        report.injected = {
            **dict(self.injected),
            "relay processes killed (-9)": self.fleet.kills,
            **{f"user turns {k}": v for k, v in self.created.items()},
        }
        report.noop_violations = self.noop_violations
        with db.connect(self.url) as conn, conn.cursor(row_factory=dict_row) as cur:
            report.runs = {r["status"]: r["n"] for r in cur.execute(self.q.run_statuses)}
            report.tool_calls = {
                r["tool_name"]: r["n"] for r in cur.execute(self.q.tool_calls_by_tool)
            }
            parked = Counter(
                f"{r['tool_name']} {r['status']}: {r['reason'][:80]}"
                for r in cur.execute(self.q.parked_calls)
            )
            report.quarantined = dict(parked)
            report.kept_out_of_history = {
                r["reason"]: r["n"] for r in cur.execute(self.q.orphaned_results)
            }
            latencies = [r["seconds"] for r in cur.execute(self.q.turn_latencies)]
            threads = cur.execute(self.q.threads_with_runs).fetchall()
            conn.commit()
            report.stuck_requires_action = report.runs.get("requires_action", 0)
            report.unfinished = sum(report.runs.get(s, 0) for s in constants.ACTIVE)
            report.runs_per_turn_violations = sum(1 for t in threads if t["runs"] != 1)
            self._replay_all(conn, threads, report)
        report.latency_p50_s = incident.percentile(latencies, 0.5)
        report.latency_p95_s = incident.percentile(latencies, 0.95)
        return report

    def _replay_all(
        self, conn: psycopg.Connection[Any], threads: list[dict[str, Any]], report: SideReport
    ) -> None:
        """Replay every stored thread: no repair allowed, and the model must accept it."""

        def replayed() -> Iterator[list[dict[str, Any]]]:
            for thread in threads:
                items, repair = history.replay(
                    conn, thread["id"], thread["tenant_id"], api="responses"
                )
                conn.commit()
                report.repaired_threads += 1 if repair.changed else 0
                report.orphan_results += len(repair.dropped_orphans)
                yield items

        send_to_model(self.model.url, replayed(), report)


def send_to_model(
    model_url: str, histories: Iterable[list[dict[str, Any]]], report: SideReport
) -> None:
    """Send each history to the strict scripted model; count those it rejects, by kind."""
    client = openai.OpenAI(base_url=model_url + "/v1", api_key="x", max_retries=0)
    rejections: Counter[str] = Counter()
    try:
        for items in histories:
            report.threads_replayed += 1
            try:
                client.responses.create(model=MODEL, input=items)  # type: ignore[arg-type]
            except openai.BadRequestError as err:
                rejections[rejection_kind(err)] += 1
    finally:
        client.close()
    report.rejected_threads = sum(rejections.values())
    report.rejections = dict(rejections)


def rejection_kind(err: openai.BadRequestError) -> str:
    """The shape of a 400, without its ids: 'No tool call found for function call output'."""
    message = error_message(err)
    return message.split(" with call_id")[0].split(" for call_id")[0].split(" call_")[0]


# -- the naive side -------------------------------------------------------------------------


class NaiveSide:
    """The same scenario through ``demo.naive``: same arrivals, faults and backend."""

    def __init__(self, cfg: DemoConfig, scenario: Scenario) -> None:
        self.cfg, self.scenario = cfg, scenario
        self.model = incident.start_model()
        self.services = Services.start()
        endpoints = {tool: self.services.endpoint(tool) for tool in incident.SERVICES.values()}
        self.naive = NaiveCoordinator(
            self.model.url,
            endpoints,
            workers=cfg.processes,
            slots=16,
            tool_timeout_s=TOOL_TIMEOUT_S,
        )
        self.stop = threading.Event()
        self.resent = 0

    def close(self) -> None:
        self.stop.set()
        self.naive.stop()
        self.model.stop()
        self.services.stop()

    def play(self) -> SideReport:
        self.naive.start()
        started = time.monotonic()
        backend = threading.Thread(target=self._backend, name="naive-backend", daemon=True)
        backend.start()
        convs = {f"conv-{c.index}": c for c in self.scenario.conversations}
        bar = Progress("naive", len(convs), self.cfg.progress)
        with fault_schedule(
            self.scenario, started, self.services.inject_stalls, self.naive.crash_worker
        ):
            for conv in pace(started, self.scenario.conversations):
                copies = 2 if conv.double_submit else 1
                barrier = threading.Barrier(copies)

                def send(conv: Conversation = conv, barrier: threading.Barrier = barrier) -> None:
                    barrier.wait()
                    self.naive.submit_turn(f"conv-{conv.index}", conv.message)

                for _ in range(copies):
                    threading.Thread(target=send, daemon=True).start()
                bar.update(self._ended(), "arriving")
        deadline = time.monotonic() + NAIVE_TAIL_S
        while self.naive.busy() and time.monotonic() < deadline:
            bar.update(self._ended(), "finishing")
            time.sleep(POLL_S)  # polling a condition with a deadline
        bar.update(self._ended(), "done")
        bar.close()
        elapsed = time.monotonic() - started
        self.stop.set()
        backend.join()
        report = self._report(convs)
        report.elapsed_s = elapsed
        return report

    def _ended(self) -> int:
        with self.naive.lock:
            outcomes = list(self.naive.outcomes.values())
        return sum(1 for o in outcomes if o.completed or o.bricked or o.failed)

    def _backend(self) -> None:
        twice = {f"conv-{c.index}" for c in self.scenario.conversations if c.approve_twice}
        while not self.stop.wait(POLL_S):
            for thread, call_id in self.naive.pending_client_calls():
                outputs = [(call_id, {"approved": True, "by": "backend"})]
                self.naive.submit_tool_outputs(thread, outputs)
                if thread in twice:
                    self.naive.submit_tool_outputs(thread, outputs)
                    self.resent += 1

    def _report(self, convs: dict[str, Conversation]) -> SideReport:
        report = SideReport("naive")
        naive = self.naive
        report.conversations = len(convs)
        report.double_submitted = sum(1 for c in convs.values() if c.double_submit)
        report.services = {
            name: incident.audit(service, incident.SERVICES[name])
            for name, service in self.services.by_name().items()
        }
        with naive.lock:
            outcomes = dict(naive.outcomes)
            store = {t: list(items) for t, items in naive.store.items()}
            stats = naive.stats
            report.tool_calls = {"(all tools)": stats.tool_calls}
            report.injected = {
                "tool stalls armed (s)": round(self.scenario.faults.window_s),
                "workers killed (-9)": stats.crashes,
                "jobs redelivered": stats.redeliveries,
                "client outputs re-sent": self.resent,
                **{f"tool dispatches ({k})": v for k, v in stats.dispatches.items()},
                "tool timeouts": stats.timeouts,
            }
        completed = sum(1 for o in outcomes.values() if o.completed and not o.bricked)
        bricked = sum(1 for o in outcomes.values() if o.bricked)
        failed = sum(1 for o in outcomes.values() if o.failed and not o.bricked)
        report.runs = {"completed": completed, "failed": bricked + failed}
        report.unfinished = len(outcomes) - completed - bricked - failed
        report.stuck_requires_action = sum(
            1 for o in outcomes.values() if not (o.completed or o.bricked or o.failed)
        )
        for items in store.values():
            problems = history_problems(items)
            report.orphan_results += problems["orphan"]
            report.duplicate_outputs += problems["duplicate"]
        send_to_model(self.model.url, store.values(), report)
        latencies = [
            o.completed_at - o.submitted_at
            for o in outcomes.values()
            if o.completed_at is not None and not o.bricked
        ]
        report.latency_p50_s = incident.percentile(latencies, 0.5)
        report.latency_p95_s = incident.percentile(latencies, 0.95)
        return report


# -- the report -----------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def table(ours: SideReport, naive: SideReport | None) -> str:
    """The side-by-side report as text."""
    sides = [ours] + ([naive] if naive else [])

    def runs(r: SideReport) -> str:
        expired = "-" if r.name == "naive" else str(r.runs.get("expired", 0))
        return f"{r.runs.get('completed', 0)} / {r.runs.get('failed', 0)} / {expired}"

    def service_figure(name: str, attr: str) -> Callable[[SideReport], Any]:
        return lambda r: getattr(r.services[name], attr)

    def per_service(attr: str) -> list[tuple[str, Callable[[SideReport], Any]]]:
        return [
            (f"  {name} ({tool})", service_figure(name, attr))
            for name, tool in incident.SERVICES.items()
        ]

    rows: list[tuple[str, Callable[[SideReport], Any]]] = [
        ("conversations (double-submitted)", lambda r: f"{r.conversations} ({r.double_submitted})"),
        ("runs completed / failed / expired", runs),
        ("runs stuck in requires_action", lambda r: r.stuck_requires_action),
        ("runs unfinished at the deadline", lambda r: r.unfinished),
        ("tool calls", lambda r: sum(r.tool_calls.values())),
        ("tool requests received", lambda r: sum(a.deliveries for a in r.services.values())),
        ("side effects (services' audits)", lambda r: r.effects()),
        *per_service("effects"),
        ("DUPLICATE side effects", lambda r: r.duplicates("request")),
        *per_service("duplicates_same_request"),
        ("  of which for one tool call id", lambda r: r.duplicates("call")),
        ("answered from idempotency store", lambda r: sum(a.replayed for a in r.services.values())),
        ("ticket lookups", lambda r: r.services["ticketing"].lookups),
        ("ORPHAN tool results in history", lambda r: r.orphan_results),
        ("calls answered twice in history", lambda r: r.duplicate_outputs),
        (
            "threads replay had to repair",
            lambda r: r.repaired_threads if r.name != "naive" else "-",
        ),
        (
            "threads the model REJECTS (bricked)",
            lambda r: f"{r.rejected_threads}/{r.threads_replayed}",
        ),
        ("quarantined calls", lambda r: sum(r.quarantined.values()) if r.name != "naive" else "-"),
        ("turn latency p50", lambda r: _fmt(r.latency_p50_s)),
        ("turn latency p95", lambda r: _fmt(r.latency_p95_s)),
        ("wall time", lambda r: _fmt(r.elapsed_s)),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{'':{width}}" + "".join(f"{s.name:>14}" for s in sides)]
    lines.append("-" * (width + 14 * len(sides)))
    for label, get in rows:
        lines.append(f"{label:{width}}" + "".join(f"{get(s)!s:>14}" for s in sides))
    for side in sides:
        details = []
        for title, values in (
            ("faults and duplicates injected", side.injected),
            ("quarantined (reasons)", side.quarantined),
            ("results kept out of every history (orphaned_results)", side.kept_out_of_history),
            ("model rejections", side.rejections),
        ):
            if values:
                details.append(f"  {title}:")
                details += [f"    {k}: {v}" for k, v in sorted(values.items())]
        examples = [e for a in side.services.values() for e in a.examples][:3]
        if examples:
            details.append("  e.g. done more than once: " + "; ".join(examples))
        if details:
            lines += ["", f"{side.name}:", *details]
    return "\n".join(lines)


def verdict(ours: SideReport, naive: SideReport | None) -> str:
    if ours.clean():
        text = (
            "outbox: no duplicate side effect, no orphan tool result, no bricked thread, "
            "no stuck run."
        )
    else:
        text = "outbox: FAILED: see the figures above (duplicates, orphans or stuck runs)."
    if naive is not None:
        text += (
            f"\nnaive:  {naive.duplicates('request')} duplicate side effects, "
            f"{naive.rejected_threads} bricked threads under the same faults."
        )
    return text


def run_demo(cfg: DemoConfig) -> tuple[SideReport, SideReport | None, dict[str, Any]]:
    """Play the scenario on both sides; returns (ours, naive, context)."""
    server = cfg.server_url or db.database_url(start=True)
    scenario = incident.build(cfg.runs, cfg.seed)
    log_dir = db.home() / "demo"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"relay-{cfg.database}.log"
    log_path.write_bytes(b"")
    started = time.monotonic()
    url = prepare_database(server, cfg.database)
    ours_side = OurSide(cfg, url, scenario, log_path)
    try:
        ours = ours_side.play()
    finally:
        ours_side.close()
    naive: SideReport | None = None
    if cfg.naive:
        naive_side = NaiveSide(cfg, scenario)
        try:
            naive = naive_side.play()
        finally:
            naive_side.close()
    context = {
        "database": db.redact(url),
        "relay_log": str(log_path),
        "runs": cfg.runs,
        "processes": cfg.processes,
        "seed": cfg.seed,
        "tool_timeout_s": TOOL_TIMEOUT_S,
        "stall_s": incident.STALL_S,
        "fault_window_s": [
            round(scenario.faults.window_start_s, 2),
            round(scenario.faults.window_start_s + scenario.faults.window_s, 2),
        ],
        "kill_at_s": [round(t, 2) for t in scenario.faults.kill_at_s],
        "total_s": round(time.monotonic() - started, 1),
    }
    return ours, naive, context


def run(cfg: DemoConfig, json_path: Path | None = None) -> int:
    """``outbox demo``: play, print the table (and JSON); 1 if the outbox side is not clean."""
    ours, naive, context = run_demo(cfg)
    print(
        f"database {context['database']}; {cfg.runs} conversations, {cfg.processes} relay "
        f"processes, seed {cfg.seed}; tool timeout {TOOL_TIMEOUT_S}s, stalls of "
        f"{incident.STALL_S}s in the window {context['fault_window_s']}s, kill -9 at "
        f"{context['kill_at_s']}s"
    )
    print()
    print(table(ours, naive))
    print()
    print(verdict(ours, naive))
    print(f"(relay logs: {context['relay_log']}; total {context['total_s']}s)")
    if json_path is not None:
        data = {
            "context": context,
            "outbox": ours.to_json(),
            "naive": naive.to_json() if naive else None,
            "ok": ours.clean(),
        }
        json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0 if ours.clean() else 1
