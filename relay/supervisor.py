"""``outbox relay --processes N``: keep N worker processes running.

Each child is a fresh interpreter (``spawn``) with its own worker id, connections and, with
``--metrics-port P``, metrics on port P + its index. A child that dies is started again
after a short backoff. The supervisor saw it exit, so nothing of it still runs: it ends the
dead child's leases at once (``expire_leases_of``) and the next rescue by any worker takes
its rows back, instead of waiting out the lease (30 s by default). A worker killed with its
supervisor (a whole machine lost) is still rescued when its leases run out. SIGTERM/SIGINT are
passed on to the children, which shut down gracefully; a second signal kills them. A child
whose supervisor dies (even by kill -9) notices and shuts down gracefully too.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import psycopg

from outbox import db, logs
from outbox.logs import log
from outbox.relay.config import RelayConfig, new_worker_id, raise_open_files_limit, worker_id_of
from outbox.relay.worker import Worker, freeze_startup_heap, leave_process, run_traced
from outbox.sql import Queries

logger = logging.getLogger("relay.supervisor")
RESTART_BACKOFF_MAX_S = 10.0
HEALTHY_AFTER_S = 60.0  # a child that lived this long restarts without the backoff it built up
PARENT_CHECK_S = 1.0  # how often a worker checks that its supervisor is still alive


def _child(cfg: RelayConfig, log_level: str, supervisor_pid: int, tag: str) -> None:
    logs.setup(log_level)
    raise_open_files_limit()
    freeze_startup_heap()
    worker = Worker(dataclasses.replace(cfg, worker_id=new_worker_id(tag)))
    # The supervisor's pid comes from the supervisor: by the time this child has imported
    # everything, the supervisor may already be dead and getppid() would not tell.
    watcher = threading.Thread(
        target=_stop_when_orphaned, args=(worker, supervisor_pid), name="parent", daemon=True
    )
    watcher.start()
    raise SystemExit(leave_process(run_traced(worker)))


def _stop_when_orphaned(worker: Worker, supervisor_pid: int) -> None:
    """A worker whose supervisor died (even by kill -9) stops gracefully, never lingers."""
    while not worker.done.wait(PARENT_CHECK_S):
        if os.getppid() != supervisor_pid:
            log(logger, logging.WARNING, "relay.supervisor_gone", supervisor=supervisor_pid)
            worker.stop()
            return


def _config_for(cfg: RelayConfig, index: int) -> RelayConfig:
    port = None if cfg.metrics_port is None else cfg.metrics_port + index
    return dataclasses.replace(cfg, metrics_port=port)


def expire_leases_of(cfg: RelayConfig, worker_id: str) -> None:
    """End the leases of a dead child now (see the module docstring); if the database
    cannot be reached, they run out by themselves."""
    q = Queries(Path(__file__).parent / "queries" / "relay.sql", cfg.schema)
    try:
        with psycopg.connect(
            cfg.database_url,
            autocommit=True,
            connect_timeout=db.CONNECT_TIMEOUT_S,
            application_name="outbox-relay-supervisor",
        ) as conn:
            ended = conn.execute(q.expire_leases_of, {"worker": worker_id}).fetchall()
    except psycopg.Error as err:
        log(
            logger,
            logging.WARNING,
            "relay.child_leases_left",
            worker=worker_id,
            error=repr(err),
            hint="its rows are rescued when their leases run out",
        )
        return
    if ended:
        log(logger, logging.WARNING, "relay.child_leases_ended", worker=worker_id, n=len(ended))


def supervise(cfg: RelayConfig, processes: int, log_level: str = "INFO") -> int:
    context = multiprocessing.get_context("spawn")
    children: dict[int, multiprocessing.process.BaseProcess] = {}
    restarts: dict[int, int] = {}
    started: dict[int, float] = {}
    worker_ids: dict[int, str] = {}
    signals = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal signals
        signals += 1
        for child in children.values():
            if child.is_alive() and child.pid is not None:
                if signals == 1:
                    child.terminate()
                else:
                    child.kill()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def start(index: int) -> None:
        tag = uuid.uuid4().hex[:6]
        child = context.Process(
            target=_child,
            args=(_config_for(cfg, index), log_level, os.getpid(), tag),
            name=f"relay-{index}",
        )
        child.start()
        assert child.pid is not None
        children[index] = child
        started[index] = time.monotonic()
        worker_ids[index] = worker_id_of(child.pid, tag)
        log(
            logger,
            logging.INFO,
            "relay.child_started",
            index=index,
            pid=child.pid,
            worker=worker_ids[index],
        )

    for index in range(processes):
        start(index)
    while children:
        sentinels = [c.sentinel for c in children.values()]
        multiprocessing.connection.wait(sentinels, timeout=1.0)
        for index, child in list(children.items()):
            if child.is_alive():
                continue
            child.join()
            del children[index]
            expire_leases_of(cfg, worker_ids[index])
            if signals:
                continue
            if time.monotonic() - started[index] >= HEALTHY_AFTER_S:
                restarts[index] = 0
            restarts[index] = restarts.get(index, 0) + 1
            wait_s = min(RESTART_BACKOFF_MAX_S, 0.2 * 2 ** restarts[index])
            log(
                logger,
                logging.WARNING,
                "relay.child_died",
                index=index,
                exitcode=child.exitcode,
                restart_in_s=wait_s,
            )
            time.sleep(wait_s)  # backoff before restarting a crashing child, not a race fix
            if signals:  # stopped while waiting: no new child
                continue
            start(index)
    return 0
