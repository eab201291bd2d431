"""``outbox relay --processes N``: keep N worker processes running.

Each child is a fresh interpreter (``spawn``) with its own worker id, connections and, with
``--metrics-port P``, metrics on port P + its index. A child that dies is started again
after a short backoff; its leases expire and any worker rescues its rows. SIGTERM/SIGINT are
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

from relay import logs
from relay.config import RelayConfig, new_worker_id
from relay.logs import log
from relay.worker import Worker, freeze_startup_heap, leave_process, raise_open_files_limit

logger = logging.getLogger("relay.supervisor")
RESTART_BACKOFF_MAX_S = 10.0
HEALTHY_AFTER_S = 60.0  # a child that lived this long restarts without the backoff it built up
PARENT_CHECK_S = 1.0  # how often a worker checks that its supervisor is still alive


def _child(cfg: RelayConfig, log_level: str, supervisor_pid: int) -> None:
    logs.setup(log_level)
    raise_open_files_limit()
    freeze_startup_heap()
    worker = Worker(dataclasses.replace(cfg, worker_id=new_worker_id()))
    # The supervisor's pid comes from the supervisor: by the time this child has imported
    # everything, the supervisor may already be dead and getppid() would not tell.
    watcher = threading.Thread(
        target=_stop_when_orphaned, args=(worker, supervisor_pid), name="parent", daemon=True
    )
    watcher.start()
    raise SystemExit(leave_process(worker.run()))


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


def supervise(cfg: RelayConfig, processes: int, log_level: str = "INFO") -> int:
    context = multiprocessing.get_context("spawn")
    children: dict[int, multiprocessing.process.BaseProcess] = {}
    restarts: dict[int, int] = {}
    started: dict[int, float] = {}
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
        child = context.Process(
            target=_child,
            args=(_config_for(cfg, index), log_level, os.getpid()),
            name=f"relay-{index}",
        )
        child.start()
        children[index] = child
        started[index] = time.monotonic()
        log(logger, logging.INFO, "relay.child_started", index=index, pid=child.pid)

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
