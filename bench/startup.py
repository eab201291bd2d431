"""``python -m bench.startup [REPEAT]``: the CPU an ``outbox`` process costs to start.

The test suite starts about a hundred relay processes and as many other ``outbox``
processes, so their start-up is much of its CPU (docs/testing.md, "How this project's suite
runs"). Each command runs REPEAT times (default 5) as its own process; the figure is the
median of the CPU (user + system) its rusage reports, children included: a relay started on
a migrated scratch database and stopped with SIGTERM once it logged ``relay.started``,
``outbox runs list`` there, and ``outbox --help``. The embedded server (or
``OUTBOX_DATABASE_URL``); prints JSON.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

from bench import db as bdb
from outbox import db
from outbox.testing.relay import FAST_ARGS

START_TIMEOUT_S = 60.0  # a relay that has not logged relay.started by then is a failure


def cpu_of(command: list[str], env: dict[str, str], until: str | None) -> float:
    """CPU seconds of ``command`` (and its waited-for children); with ``until``, it is sent
    SIGTERM after a line of its output holds that text."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    if until is not None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for line in process.stdout:
            if until in line:
                break
            if time.monotonic() > deadline:
                process.kill()
                raise TimeoutError(f"{' '.join(command)} did not log {until}")
        process.send_signal(signal.SIGTERM)
    process.stdout.read()
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0  # reaped here; keeps Popen from waiting again
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    repeat = int(argv[0]) if argv else 5
    server = db.database_url(start=True)
    name = bdb.name_for("startup")
    url = bdb.create(server, name)
    env = {**os.environ, "OUTBOX_DATABASE_URL": url}
    outbox = [sys.executable, "-m", "outbox.commands"]
    commands = {
        "relay": ([*outbox, "relay", *FAST_ARGS], "relay.started"),
        "runs list": ([*outbox, "runs", "list"], None),
        "--help": ([*outbox, "--help"], None),
    }
    try:
        out = {
            what: round(statistics.median(cpu_of(c, env, until) for _ in range(repeat)), 3)
            for what, (c, until) in commands.items()
        }
    finally:
        bdb.drop(server, name)
    print(json.dumps({"cpu_s_median": out, "repeat": repeat, "load": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
