"""Database connections of a relay process: a few fixed links, each reopened when it breaks.

A relay process talks to PostgreSQL through a small fixed set of connections, whatever it
holds in flight (``relay.engine``): the claim loop, the preparer, the completers, the
maintenance thread and the listener each own one ``Link``. A link whose connection broke
(``pg_terminate_backend``, a server restart, a network cut) drops it and opens a new one
on its next use; the statement that met the broken connection is tried again by its owner,
and no row is charged an attempt for it (docs/relay.md, "When the database goes away").

While the server cannot be reached, a link says so once per ``OUTAGE_LOG_S`` (with how many
failures it saw), not once per retry, and the ``outbox_relay_db_unavailable`` gauge tells
which links are waiting: an outage is a state of the relay, not a flood of errors. A relay
that starts during an outage waits the same way (``wait_for_database``) before it starts.

A statement the server *refused* for what it held (``outbox.db.refused``: a data exception
such as 22P05 for a NUL in jsonb, or a program limit such as 54001, stack depth) is no
outage, though psycopg raises some of them as ``OperationalError``: the connection is fine, and
sending the same data again would be refused again. Its owner deals with the data
(``Link.outage`` tells the two apart).

A transaction the server rolled back for a conflict with another (``conflict``: 40P01
deadlock, 40001 serialization failure) is no outage either: the connection is fine and the
same statements, tried again, pass. The link keeps its connection, logs ``db.conflict``
and its owner tries again after a short random pause, which keeps two relays that
deadlocked from meeting again in step.

A relay paused inside a transaction (stop-the-world, ``SIGSTOP``, a frozen VM) holds its
row locks for as long as it is paused, and the rescue's ``SKIP LOCKED`` cannot take back
a row it holds, whatever its lease says. So every link of a worker asks the server to end
its session once a transaction has waited on the client for a whole lease
(``idle_in_transaction_session_timeout``): the locks go with it, by the time the lease
runs out. A relay's transactions never wait on anything but their own statements, so a
healthy one never comes near it; the paused one finds its connection gone on waking, and
its writes meet the fence like any late write.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from outbox import db
from outbox.errors import DatabaseConfigError, DatabaseUnavailable, OutboxError
from outbox.logs import log

logger = logging.getLogger("relay.links")
RECONNECT_MAX_S = 5.0  # longest wait between reconnection attempts
OUTAGE_LOG_S = 10.0  # seconds between two log lines about one link's outage
PREPARE_THRESHOLD = 0  # prepared at once: the first execution runs the generic plan too
# Settings of a link that prepares (see Link). JIT off: enable_seqscan = off adds its penalty
# to the cost of any plan that keeps a scan, and a cost that high makes a server with JIT
# (PostgreSQL 15 here) compile the statement, for 100 ms and more a claim.
# SQLSTATE class 40, transaction rollback: a deadlock or a serialization failure.
CONFLICT_CLASS = "40"
CONFLICT_RETRY_S = 0.05  # the longest random pause before a conflicted transaction is retried
GENERIC_PLANS = (
    "SET plan_cache_mode = force_generic_plan",
    "SET enable_seqscan = off",
    "SET jit = off",
)


def reconnect_delay_s(failures: int) -> float:
    """How long to wait before the next try after ``failures`` failed ones in a row.

    The first failure retries at once: a connection killed while idle (a restarted
    server, ``pg_terminate_backend``) is usually replaced on the first try."""
    if failures <= 1:
        return 0.0
    return float(min(RECONNECT_MAX_S, 0.05 * 2**failures))


class Link:
    """One thread's database connection, reopened after the server or network fails.

    A link that prepares (the claim loop, the completers, the preparer) runs each statement
    on one *generic* plan (``plan_cache_mode = force_generic_plan``), planned once per
    connection: planning the completion statements cost about 20 us a call, as much as
    running some of them. A generic plan keeps the choices it made with the statistics of
    its moment, and results, messages and the journal start empty and grow by thousands a
    second (a repeat check planned as a scan of an "empty" tool_results went quadratic:
    313 us a call). So these links also turn sequential scans off: wherever an index can
    find the rows, it does (a table with no usable index is still scanned). Every relay
    statement finds its rows by an index, and ``tests/integration/test_hot_path.py``
    checks the very plans the relay runs. The maintenance side (rescue, depth gauges) runs
    a few statements a second: it keeps custom plans.
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        autocommit: bool = False,
        prepare: bool = True,
        on_outage: Any = None,
        worker: str | None = None,
        idle_in_transaction_s: float | None = None,
    ) -> None:
        self.url = url
        self.worker = worker  # named in every log line of this link
        self.name = name
        self.autocommit = autocommit
        self.prepare = prepare
        self.on_outage = on_outage  # called with (link name, waiting: bool)
        self.idle_in_transaction_s = idle_in_transaction_s  # see the module docstring
        self.conn: psycopg.Connection[Any] | None = None
        self.failures = 0
        self.logged_at = 0.0  # monotonic; when the outage was last logged
        self.unlogged = 0  # failures since then

    def get(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(
                self.url,
                autocommit=self.autocommit,
                connect_timeout=db.CONNECT_TIMEOUT_S,
                application_name=f"outbox-relay-{self.name}",
                prepare_threshold=PREPARE_THRESHOLD if self.prepare else None,
            )
            settings = list(GENERIC_PLANS) if self.prepare else []
            if self.idle_in_transaction_s is not None:
                ms = max(1, round(self.idle_in_transaction_s * 1000))
                settings.append(f"SET idle_in_transaction_session_timeout = {ms}")
            for setting in settings:
                self.conn.execute(setting, prepare=False)
            if settings and not self.autocommit:
                self.conn.commit()
        return self.conn

    def failed(self, err: Exception) -> float:
        """Drop the connection after ``err``; returns how long to wait before trying again
        (``reconnect_delay_s``). A conflict keeps the connection (``conflicted``)."""
        conn = self.conn
        if conflict(err) and conn is not None and not conn.closed and not conn.broken:
            return self.conflicted(conn, err)
        self.failures += 1
        self.unlogged += 1
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None
        now = time.monotonic()
        if now - self.logged_at >= OUTAGE_LOG_S:
            log(
                logger,
                logging.WARNING,
                "db.unavailable",
                worker=self.worker,
                link=self.name,
                error=str(err).strip(),
                failures=self.unlogged,
            )
            self.logged_at, self.unlogged = now, 0
        if self.on_outage is not None:
            self.on_outage(self.name, True)
        return reconnect_delay_s(self.failures)

    def conflicted(self, conn: psycopg.Connection[Any], err: Exception) -> float:
        """Roll back a transaction the server ended for a conflict, keep the connection, and
        return a short random pause before the owner tries again."""
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        log(
            logger,
            logging.WARNING,
            "db.conflict",
            worker=self.worker,
            link=self.name,
            error=refusal(err),
        )
        return random.uniform(0.0, CONFLICT_RETRY_S)

    def outage(self, err: BaseException) -> bool:
        """Whether ``err`` means the server could not be reached or dropped us (wait,
        reconnect and try again: ``failed``), rather than a refusal of what a statement
        held or a bug, which the same statement would meet again."""
        if not isinstance(err, psycopg.Error) or db.refused(err):
            return False
        conn = self.conn
        broken = conn is None or conn.closed or conn.broken
        return isinstance(err, psycopg.OperationalError) or broken

    def ok(self) -> None:
        if self.failures:
            log(
                logger,
                logging.WARNING,
                "db.reconnected",
                worker=self.worker,
                link=self.name,
                failures=self.failures,
            )
            if self.on_outage is not None:
                self.on_outage(self.name, False)
            self.logged_at = 0.0
        self.failures = 0

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


def conflict(err: BaseException) -> bool:
    """Whether the server rolled the transaction back for a conflict with another one."""
    sqlstate = getattr(err, "sqlstate", None) or ""
    return isinstance(err, psycopg.Error) and sqlstate[:2] == CONFLICT_CLASS


def refusal(err: BaseException) -> str:
    """What the server said when it refused a statement, for an error message."""
    if not isinstance(err, psycopg.Error):
        return f"{type(err).__name__}: {err}"
    diag = err.diag
    said = diag.message_primary or str(err).strip()
    if diag.message_detail:
        said += f" ({diag.message_detail})"
    return f"{said} [SQLSTATE {err.sqlstate}]"


class TooManyConnections(OutboxError):
    """The relay would need more connections than the server has free."""


def check_connection_budget(
    conn: psycopg.Connection[Any], processes: int, per_process: int
) -> None:
    """Refuse to start a relay the server cannot serve, naming the numbers.

    Needed: ``processes * per_process`` connections (each worker process holds a fixed
    few, whatever it has in flight). Free: ``max_connections`` less the slots reserved for
    superusers (and, from PostgreSQL 16, for ``pg_use_reserved_connections``) less the
    connections open now. A relay started anyway would have its links refused and wait,
    and so would every other client of the server. ``conn`` is the start-up check's own
    connection, closed before the relay opens its links."""
    needed = processes * per_process
    row = conn.execute(
        "SELECT current_setting('max_connections')::int,"
        " current_setting('superuser_reserved_connections')::int"
        " + coalesce(current_setting('reserved_connections', true)::int, 0),"
        " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
    ).fetchone()
    assert row is not None
    max_connections, reserved, in_use = (int(v) for v in row)
    free = max_connections - reserved - in_use + 1  # ``conn`` is closing
    if needed > free:
        raise TooManyConnections(
            f"the relay needs {needed} database connections ({processes} process(es) x "
            f"{per_process}), but the server has {free} free: max_connections "
            f"{max_connections}, {reserved} reserved, {in_use - 1} in use by other clients",
            "start fewer --processes, lower --db-connections (in-flight work does not need "
            "connections: --concurrency is free), close other clients, or raise "
            "max_connections on the server",
        )


def wait_for_database(
    resolve: Callable[[], str],
    check: Callable[[psycopg.Connection[Any]], None],
    *,
    worker: str,
    stop: threading.Event,
    timeout_s: float | None = None,
) -> str | None:
    """The database URL once the database answers and ``check`` passes on a connection to
    it; None when ``stop`` is set first.

    A relay started (or restarted by its process manager) while the server is down waits
    for it, as a running relay's links do: the URL is resolved again on every try
    (``resolve``: the embedded server's is known only while it runs), with the links'
    backoff, logging ``db.unavailable`` with the hint and how long it has waited once per
    ``OUTAGE_LOG_S``, and ``db.reconnected`` when the server answers. Settings the server
    refuses (``DatabaseConfigError``) and whatever ``check`` raises (a schema behind this
    code, too few free connections) are raised at once: waiting would not mend them. After
    ``timeout_s`` (None: no limit) the last failure is raised as ``DatabaseUnavailable``.
    """
    started = time.monotonic()
    failures = unlogged = 0
    logged_at: float | None = None
    while True:
        url = ""
        try:
            url = resolve()
            with db.connect(url, autocommit=True) as conn:
                check(conn)
        except DatabaseConfigError:
            raise
        except (DatabaseUnavailable, psycopg.OperationalError) as err:
            problem = (
                err if isinstance(err, DatabaseUnavailable) else db.explain_connect_error(url, err)
            )
        else:
            if failures:
                log(
                    logger,
                    logging.WARNING,
                    "db.reconnected",
                    worker=worker,
                    link="start",
                    failures=failures,
                    waited_s=round(time.monotonic() - started, 1),
                )
            return url
        failures += 1
        unlogged += 1
        now = time.monotonic()
        waited_s = now - started
        if timeout_s is not None and waited_s >= timeout_s:
            raise DatabaseUnavailable(
                f"the database did not answer within {timeout_s:g} s: {problem.args[0]}",
                hint=problem.hint,
            ) from problem
        if logged_at is None or now - logged_at >= OUTAGE_LOG_S:
            log(
                logger,
                logging.WARNING,
                "db.unavailable",
                worker=worker,
                link="start",
                error=problem.args[0],
                hint=problem.hint,
                failures=unlogged,
                waited_s=round(waited_s, 1),
                gives_up_in_s=None if timeout_s is None else round(timeout_s - waited_s, 1),
            )
            logged_at, unlogged = now, 0
        delay = reconnect_delay_s(failures)
        if timeout_s is not None:
            delay = min(delay, timeout_s - waited_s)
        if stop.wait(delay):
            return None
