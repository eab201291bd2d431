"""Run the relay against a test database and wait for a run: for tests of your own agent.

The relay runs as what it is in production, a separate process (``python -m outbox.commands relay``,
the ``outbox relay`` command), so your test exercises the real claim loop, leases and HTTP
stack; nothing is patched. Design choice: a subprocess rather than an in-process worker,
because the library never imports the relay (an import-linter contract), and because a
test that kills or restarts the process then behaves like production.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from outbox import constants, writer

ENDED = constants.ENDED
STOP_TIMEOUT_S = 30.0  # seconds a relay gets to drain after SIGTERM before it is killed
POLL_S = 0.05  # seconds between two looks at the run while waiting


@contextmanager
def relay_process(
    database_url: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``outbox relay ARGS`` on ``database_url`` for the duration of the block.

    Its JSON logs go to this process's stderr. On exit it gets SIGTERM (it drains and
    stops) and is killed if it has not stopped after ``STOP_TIMEOUT_S``.
    """
    command = [sys.executable, "-m", "outbox.commands", "relay", "--poll-interval", "0.2", *args]
    process_env = {**os.environ, **(env or {}), "OUTBOX_DATABASE_URL": database_url}
    process = subprocess.Popen(command, env=process_env)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


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
