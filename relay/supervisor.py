"""``outbox relay --processes N``: keep N worker processes running.

Each child is a fresh interpreter (``spawn``) with its own worker id, connections and, with
``--metrics-port P``, metrics on port P + its index. A child that dies is started again
after a short backoff; its leases expire and any worker rescues its rows. SIGTERM/SIGINT are
passed on to the children, which shut down gracefully; a second signal kills them.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import signal
import time

from relay import logs
from relay.config import RelayConfig, new_worker_id
from relay.logs import log
from relay.worker import run_worker

logger = logging.getLogger("relay.supervisor")
RESTART_BACKOFF_MAX_S = 10.0


def _child(cfg: RelayConfig, log_level: str) -> None:
    logs.setup(log_level)
    raise SystemExit(run_worker(dataclasses.replace(cfg, worker_id=new_worker_id())))


def _config_for(cfg: RelayConfig, index: int) -> RelayConfig:
    port = None if cfg.metrics_port is None else cfg.metrics_port + index
    return dataclasses.replace(cfg, metrics_port=port)


def supervise(cfg: RelayConfig, processes: int, log_level: str = "INFO") -> int:
    context = multiprocessing.get_context("spawn")
    children: dict[int, multiprocessing.process.BaseProcess] = {}
    restarts: dict[int, int] = {}
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
            target=_child, args=(_config_for(cfg, index), log_level), name=f"relay-{index}"
        )
        child.start()
        children[index] = child
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
            start(index)
    return 0
