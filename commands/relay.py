"""``outbox relay``: the relay's options, read into a ``RelayConfig``, then one worker process
or a supervisor of several.

Every option's default is read from ``RelayConfig`` (a second copy would drift), and the
exit statuses are sysexits' so that a process manager can tell "start me again later" (75)
from "not before someone changes the configuration" (78). The workers, the supervisor and
the logs are imported when the command runs, not for every ``outbox`` command.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
import psycopg

from outbox import db
from outbox.commands.common import EXIT_CONFIG, EXIT_TEMPFAIL, refuse
from outbox.errors import DatabaseConfigError, DatabaseUnavailable, MigrationsBehind
from outbox.relay.config import (
    ALL_KINDS,
    RelayConfig,
    machine_concurrency,
    raisable_open_files_limit,
)

RELAY_DEFAULTS = RelayConfig(database_url="")  # the relay's options default to these
# The relay's exit statuses beside 2 (usage), from sysexits.h, for process managers: start
# again later, or not before someone changes the configuration (see `outbox relay --help`).


@click.command("relay")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,  # derived when the relay starts, from the limits it raised
    show_default=f"{machine_concurrency(open_files=raisable_open_files_limit())} on this machine",
    help=(
        "Effects in flight per process: model turns and HTTP tool calls, each a task on "
        "the process's event loop, none holding a database connection. Default: what a "
        "process can hold: half its open-files limit (raised to the hard limit) less 256, "
        "within a quarter of the memory at 20 kB an effect over --processes, at most "
        "10000. When every place is busy while rows are due, the relay logs "
        "relay.saturated once a minute and sets the outbox_relay_saturated gauge."
    ),
)
@click.option(
    "--tenant-share",
    type=click.FloatRange(0, 1, min_open=True),
    default=RELAY_DEFAULTS.tenant_share,
    show_default=True,
    help=(
        "The most of --concurrency one tenant's rows may hold in a process: the rest stays "
        "free for other tenants, so a newcomer's first call starts as soon as it is due "
        "(1 turns the reserve off)."
    ),
)
@click.option(
    "--db-connections",
    default=RELAY_DEFAULTS.db_connections,
    show_default=True,
    help=(
        "Database connections per process, whatever is in flight: claim, preparer, "
        "maintenance, listener (unless --no-listen) and the rest writing outcomes "
        "(at least one). The relay refuses to start when the server has too few free."
    ),
)
@click.option(
    "--inprocess-slots",
    default=RELAY_DEFAULTS.inprocess_slots,
    show_default=True,
    help="In-process (python) tool calls in flight per process, beside --concurrency.",
)
@click.option(
    "--inprocess-threads",
    default=RELAY_DEFAULTS.inprocess_threads,
    show_default=True,
    help=(
        "Threads running in-process tools per process. A tool that overruns its timeout "
        "keeps its thread; when all stay kept for a minute, the process exits with code "
        "75 to be restarted (by --processes or your process manager)."
    ),
)
@click.option("--processes", default=1, show_default=True, help="Worker processes to supervise.")
@click.option(
    "--lease", "lease_s", default=RELAY_DEFAULTS.lease_s, show_default=True, help="Lease length, s."
)
@click.option(
    "--poll-interval",
    "poll_s",
    default=RELAY_DEFAULTS.poll_interval_s,
    show_default=True,
    help="Fallback poll, s.",
)
@click.option(
    "--no-listen", is_flag=True, help="Poll only (for poolers in transaction mode: no LISTEN)."
)
@click.option(
    "--grace",
    "grace_s",
    default=RELAY_DEFAULTS.grace_s,
    show_default=True,
    help="SIGTERM grace, s.",
)
@click.option(
    "--retry-base",
    "retry_base_s",
    default=RELAY_DEFAULTS.retry_base_s,
    show_default=True,
    help="First retry delay, s.",
)
@click.option(
    "--rescue-interval",
    "rescue_s",
    default=RELAY_DEFAULTS.rescue_interval_s,
    show_default=True,
    help="Sweep period, s.",
)
@click.option(
    "--retention-interval",
    "retention_s",
    type=click.FloatRange(min=0),
    default=RELAY_DEFAULTS.retention_interval_s,
    show_default=True,
    help="How often idle conversations leave the hot tables by policy (outbox retention), s; "
    "0: never.",
)
@click.option(
    "--max-model-answer",
    "max_model_answer_bytes",
    type=click.IntRange(min=1024),
    default=RELAY_DEFAULTS.max_model_answer_bytes,
    show_default=True,
    help=(
        "Bytes of a model's answer read at most (default: OUTBOX_MAX_MODEL_ANSWER_BYTES or "
        "32 MiB). Past it the answer is not read further and the turn is retried; out of "
        "attempts, the run fails naming the size."
    ),
)
@click.option(
    "--kind",
    "kinds",
    type=click.Choice(ALL_KINDS),
    multiple=True,
    help="Only these kinds (repeatable); default all.",
)
@click.option(
    "--affinity-header",
    "affinity_headers",
    multiple=True,
    help="Send each model request's prompt_cache_key in this header too, for a router "
    "that keeps a conversation on the replica holding its cache: NAME, or BASE_URL=NAME "
    "for one model server only (repeatable).",
)
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics (port + process index).")
@click.option(
    "--metrics-host",
    default=RELAY_DEFAULTS.metrics_host,
    show_default=True,
    help="Address the metrics are served on (0.0.0.0: every interface, for a scraper on "
    "another machine).",
)
@click.option(
    "--start-timeout",
    "start_timeout_s",
    type=click.FloatRange(min=0),
    help="Give up (exit 75) when the database has not answered this many seconds after "
    "start. Default: wait as long as it takes, as a running relay does.",
)
@click.option(
    "--trace-exporter/--no-trace-exporter",
    default=True,
    show_default=True,
    help="When OpenTelemetry's variables ask for traces, start `outbox traces export` "
    "beside the relay (one process, stopped with it): it builds the spans from the "
    "database. Off: run the exporter yourself, anywhere.",
)
@click.option("--log-level", default="INFO", show_default=True)
def relay_command(processes: int, log_level: str, kinds: tuple[str, ...], **opts: Any) -> None:
    """Run relay workers: claim outbox rows, call tools and models, record the outcomes.

    Logs are JSON lines on stderr. SIGTERM or Ctrl-C stops claiming, lets in-flight work
    finish within the grace period and releases the rest; a second signal exits at once.

    Started while the database is down (or the embedded server stopped), the relay waits
    for it, logging db.unavailable with a hint every 10 s, then db.reconnected.

    Traces: with OTEL_EXPORTER_OTLP_ENDPOINT set (OpenTelemetry's variables), each model
    turn and tool call is a span of its run's trace, built from the database once the run
    ends by the trace exporter (`outbox traces export`, started beside the relay unless
    --no-trace-exporter) and exported over OTLP/HTTP; off otherwise. The relay itself
    builds no span. See docs/operations.md, "Traces".

    \b
    Exit status:
      0   stopped by SIGTERM or Ctrl-C (also while waiting for the database)
      2   a usage error: an option given on this command line is wrong
      75  try again later (EX_TEMPFAIL): the database did not answer within
          --start-timeout, or every in-process tool thread stayed stuck for a minute
      78  the configuration does not fit the database (EX_CONFIG): OUTBOX_DATABASE_URL
          is not a URL, the server refuses its user, password or database, the schema is
          behind this code (`outbox db upgrade`), or the server has fewer free connections
          than --processes x --db-connections
      128+N  stopped at once by a second signal N (130: Ctrl-C, 143: SIGTERM)
    """
    from outbox import logs
    from outbox.logs import log
    from outbox.relay import supervisor, worker
    from outbox.relay.capacity import files_needed
    from outbox.relay.config import new_worker_id, raise_open_files_limit
    from outbox.relay.links import TooManyConnections, check_connection_budget, wait_for_database

    fixed = RelayConfig(database_url="", completers=1, listen=not opts["no_listen"])
    completers = opts["db_connections"] - (fixed.db_connections - 1)
    if completers < 1:
        raise click.UsageError(
            f"--db-connections {opts['db_connections']} is too few: a process needs "
            f"{fixed.db_connections} (claim, preparer, maintenance"
            f"{', listener' if fixed.listen else ''} and one completer)"
        )
    worker_id = new_worker_id()
    logs.setup(log_level)
    open_files = raise_open_files_limit()
    concurrency = opts["concurrency"] or machine_concurrency(processes, open_files)
    if files_needed(concurrency) > open_files:
        log(
            logging.getLogger("relay"),
            logging.WARNING,
            "relay.concurrency_over_open_files",
            worker=worker_id,
            concurrency=concurrency,
            open_files=open_files,
            hint="effects past the limit fail to open their socket (before sending: they "
            "are retried later); raise the hard open-files limit (ulimit -Hn, LimitNOFILE= "
            "under systemd) or lower --concurrency",
        )

    def check(conn: psycopg.Connection[Any]) -> None:
        db.check_schema_current(conn)
        check_connection_budget(conn, processes, opts["db_connections"])

    try:
        with stop_on_signals() as stop:
            url = wait_for_database(
                db.database_url,
                check,
                worker=worker_id,
                stop=stop,
                timeout_s=opts["start_timeout_s"],
            )
    except (DatabaseConfigError, MigrationsBehind, TooManyConnections) as err:
        refuse(err.args[0], err.hint, EXIT_CONFIG)
    except DatabaseUnavailable as err:
        refuse(err.args[0], err.hint, EXIT_TEMPFAIL)
    if url is None:  # stopped while waiting: nothing was started
        sys.exit(0)
    cfg = RelayConfig(
        database_url=url,
        worker_id=worker_id,
        schema=db.schema_name(),
        concurrency=concurrency,
        tenant_share=opts["tenant_share"],
        inprocess_slots=opts["inprocess_slots"],
        inprocess_threads=opts["inprocess_threads"],
        completers=completers,
        lease_s=opts["lease_s"],
        poll_interval_s=opts["poll_s"],
        listen=not opts["no_listen"],
        grace_s=opts["grace_s"],
        retry_base_s=opts["retry_base_s"],
        rescue_interval_s=opts["rescue_s"],
        retention_interval_s=opts["retention_s"],
        max_model_answer_bytes=opts["max_model_answer_bytes"],
        affinity_headers=tuple(opts["affinity_headers"]),
        kinds=kinds or ALL_KINDS,
        metrics_port=opts["metrics_port"],
        metrics_host=opts["metrics_host"],
    )
    from outbox import trace_context

    try:
        trace_context.check_exporters()
    except ValueError as err:
        refuse(str(err), "use otlp, console or none", EXIT_CONFIG)
    exporter = None
    if opts["trace_exporter"] and trace_context.wanted():
        exporter = TraceExporter(url, log_level)
    try:
        if processes > 1:
            code = supervisor.supervise(cfg, processes, log_level)
        else:
            code = worker.run_worker(cfg)
    finally:
        if exporter is not None:
            exporter.stop()
    sys.exit(code)


class TraceExporter:
    """``outbox traces export`` in a process of its own beside the relay (its CPU is not
    the relay's), started again when it dies: a relay whose exporter crashed would
    otherwise leave its runs' spans waiting, seen only by the lag gauge. The exporter
    watches this process too, so a relay killed with -9 leaves no exporter for long."""

    RESTART_S = (1.0, 30.0)  # the wait before a restart: doubled after each, up to this

    def __init__(self, url: str, log_level: str) -> None:
        self.command = [sys.executable, "-m", "outbox.commands", "traces", "export"]
        self.command += ["--parent-pid", str(os.getpid()), "--log-level", log_level]
        self.env = {**os.environ, "OUTBOX_DATABASE_URL": url}
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # a restart does not race stop()
        self.process = subprocess.Popen(self.command, env=self.env)
        self.keeper = threading.Thread(target=self.keep, name="trace-exporter", daemon=True)
        self.keeper.start()

    def keep(self) -> None:
        from outbox.logs import log

        wait_s = self.RESTART_S[0]
        while True:
            started = time.monotonic()
            code = self.process.wait()
            if time.monotonic() - started > self.RESTART_S[1]:
                wait_s = self.RESTART_S[0]  # it had been running well: no backoff
            if self.stopping.wait(wait_s):
                return
            log(
                logging.getLogger("relay"),
                logging.ERROR,
                "traces.exporter_restarted",
                exit_code=code,
                after_s=wait_s,
            )
            with self.lock:
                if self.stopping.is_set():
                    return
                self.process = subprocess.Popen(self.command, env=self.env)
            wait_s = min(wait_s * 2, self.RESTART_S[1])

    def stop(self) -> None:
        """SIGTERM: it finishes the batch in hand (its marks are cleared only after export)."""
        with self.lock:
            self.stopping.set()
            process = self.process
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while the block runs: the relay waiting for its
    database stops at once, quietly (no traceback of an interrupted sleep)."""
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda _signum, _frame: stop.set())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
