"""Small builders shared by the tests: register tools, open threads and runs."""

from __future__ import annotations

import fcntl
import importlib
import itertools
import logging
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import psycopg

from outbox import registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

TENANT = "acme"

# One autocommit connection per test database for the helpers that read it again and again
# (a check polled until a deadline): a new connection per look costs the server a backend
# each time. The ``db_url`` fixture closes it before it drops the database.
_KEPT: dict[str, psycopg.Connection[Any]] = {}


def kept(db_url: str) -> psycopg.Connection[Any]:
    """The kept autocommit connection to ``db_url`` (a new one if it was cut)."""
    conn = _KEPT.get(db_url)
    if conn is None or conn.closed or conn.broken:
        conn = _KEPT[db_url] = psycopg.connect(db_url, autocommit=True)
    return conn


def look(db_url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    """The rows of ``query`` read on the kept connection; once more on a new one when the
    kept one was cut since (a test that restarts the server or kills backends)."""
    conn = kept(db_url)
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.OperationalError:
        if not conn.broken:
            raise
    return kept(db_url).execute(query, params).fetchall()


def forget(db_url: str) -> None:
    """Close the kept connection to ``db_url``, if any."""
    conn = _KEPT.pop(db_url, None)
    if conn is not None:
        conn.close()


def add_tool(
    conn: psycopg.Connection[Any], name: str = "lookup_order", **kw: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "executor": "http",
        "endpoint": f"http://127.0.0.1:9/tools/{name}",
        "json_schema": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    }
    spec.update(kw)
    return registry.register(conn, registry.ToolSpec(**spec))


def new_run(
    conn: psycopg.Connection[Any],
    *,
    tenant: str = TENANT,
    tools: list[str] | None = None,
    key: str | None = None,
    thread_id: uuid.UUID | None = None,
    **kw: Any,
) -> writer.RunRef:
    if thread_id is None:
        thread_id = writer.create_thread(conn, tenant).id
    return writer.start_run(
        conn,
        StartRun(
            tenant_id=tenant,
            thread_id=thread_id,
            model="scripted",
            message="hello",
            tools=tools or [],
            idempotency_key=key,
            **kw,
        ),
    )


def turn(run: writer.RunRef, step: int, *calls: tuple[str, str, Any], text: str | None = None):
    return ModelTurnIn(
        tenant_id=run.tenant_id,
        run_id=run.id,
        step_no=step,
        content=text,
        tool_calls=[ToolCallIn(tool_call_id=cid, name=n, arguments=a) for cid, n, a in calls],
        input_tokens=10,
        output_tokens=5,
    )


# Ports for servers a test starts in another process, which must be told its port before it
# binds. A port the kernel hands to ``bind(0)`` is in its ephemeral range, where any
# outgoing connection of any process (to PostgreSQL, to a fake server) may take it between
# the probe and the server's bind: the server then fails with "address already in use".
# So ports come from below that range, a block per process. A process claims its block
# with a lock file it holds until it ends, so no two live processes hand out the same port,
# also when two checkouts run their suites at once (a block per xdist worker number did not:
# both runs' gw0 shared one, and a test reached the other run's server).
PORTS_PER_BLOCK = 200
PORT_LOCKS = Path(tempfile.gettempdir()) / "outbox-test-ports"
_next_port = itertools.count()
_block: tuple[int, IO[bytes]] | None = None  # the first port of the block, and its lock


def _claim_block() -> int:
    global _block
    if _block is None:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        PORT_LOCKS.mkdir(exist_ok=True)
        for first in range(10_000, low - PORTS_PER_BLOCK + 1, PORTS_PER_BLOCK):
            lock = open(PORT_LOCKS / f"{first}.lock", "wb")  # noqa: SIM115 (held for life)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            _block = (first, lock)
            break
        else:
            raise RuntimeError(f"every block of test ports below {low} is held (see {PORT_LOCKS})")
    return _block[0]


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on, outside the ephemeral range, from a block no
    other live process hands out."""
    first = _claim_block()
    for _ in range(PORTS_PER_BLOCK):
        port = first + next(_next_port) % PORTS_PER_BLOCK
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:  # in use, or still closing: the next one
                continue
        return port
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_BLOCK - 1}")


class _Lazy(ModuleType):
    """Stands for a module not imported yet; see ``lazy_import``."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # pytest's look at a module's globals, unwrap, copy
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__name__), attribute)


def lazy_import(name: str) -> ModuleType:
    """The module ``name``, imported at the first use of one of its public names: a test
    module that imports a costly package (the Agents SDK, about 0.9 s of CPU) then costs
    nothing to collect, in every pytest-xdist process, until one of its tests runs. (Not
    ``importlib.util.LazyLoader``: pytest reads every global of a test module it collects,
    ``_mock_name`` among others, and that loads the module.)"""
    return _Lazy(name)


def blocked_on_a_lock(db_url: str) -> bool:
    """Whether a session of the test's database waits for a lock now."""
    found = look(
        db_url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'",
    )
    return bool(found[0][0])


def thread_lockable(db_url: str, thread: Any) -> bool:
    """Whether another session can lock the thread's row now (without waiting for it)."""
    with psycopg.connect(db_url) as conn:
        try:
            conn.execute("SELECT 1 FROM outbox.threads WHERE id = %s FOR UPDATE NOWAIT", [thread])
        except psycopg.errors.LockNotAvailable:
            return False
    return True


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``call`` in a thread; its result or error lands in the dict."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = call()
        except Exception as err:  # handed to the test, which asserts on it
            out["error"] = err

    worker = threading.Thread(target=target)
    worker.start()
    return worker, out


@contextmanager
def server_logs() -> Iterator[list[logging.LogRecord]]:
    """The records of the server's loggers (``server.*``, JSON lines in ``outbox serve``)
    while the block runs."""
    caught: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = caught.append  # type: ignore[method-assign]
    logging.getLogger("server").addHandler(handler)
    try:
        yield caught
    finally:
        logging.getLogger("server").removeHandler(handler)
