"""Only `outbox db start` (and the demo, the tests) starts the embedded PostgreSQL.

A relay restarted by its process manager during a planned `outbox db stop` used to bring
the database back silently. Now every other command, without OUTBOX_DATABASE_URL and with
the embedded server stopped, exits 2 with an error and a hint, and starts nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from outbox import db
from tests.relay_harness import REPO


@pytest.mark.parametrize("command", [["relay"], ["db", "upgrade"], ["runs", "list"]])
def test_commands_do_not_start_the_embedded_server(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"}
    env["OUTBOX_HOME"] = str(tmp_path)
    server = db.EmbeddedServer(tmp_path / "pgdata")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "cli", *command],
            cwd=REPO,
            env=env,
            capture_output=True,
            timeout=30,
        )
    finally:
        started = server.is_running()
        if started:
            server.stop()
    assert not started, "the command started the embedded server"
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "error: OUTBOX_DATABASE_URL is not set and the embedded PostgreSQL" in err
    assert "hint: start it with `outbox db start`" in err
