"""Only `outbox db start` (and the demo, the tests) starts the embedded PostgreSQL.

A relay restarted by its process manager during a planned `outbox db stop` used to bring
the database back silently. Now every other command, without OUTBOX_DATABASE_URL and with
the embedded server stopped, exits 2 with an error and a hint, and starts nothing; the
relay waits for the server instead, and gives up with status 75 after --start-timeout.

And no command greets a newcomer with a dependency's warning about XDG_RUNTIME_DIR.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from outbox import db
from tests.relay_harness import REPO


@pytest.mark.parametrize(
    ("command", "status"),
    [(["relay", "--start-timeout", "0"], 75), (["db", "upgrade"], 75), (["runs", "list"], 75)],
)
def test_commands_do_not_start_the_embedded_server(tmp_path, command, status):
    env = {k: v for k, v in os.environ.items() if k != "OUTBOX_DATABASE_URL"}
    env["OUTBOX_HOME"] = str(tmp_path)
    server = db.EmbeddedServer(tmp_path / "pgdata")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "outbox.commands", *command],
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
    assert done.returncode == status, err
    assert "OUTBOX_DATABASE_URL is not set and the embedded PostgreSQL" in err
    assert "hint: start it with `outbox db start`" in err


@pytest.mark.parametrize(
    "command",
    [
        ["db", "url"],
        ["db", "status"],
        ["db", "stop"],
        ["runs", "list"],
        ["relay", "--start-timeout", "0"],
    ],
)
def test_commands_print_no_warning_without_xdg_runtime_dir(tmp_path, command):
    # A container or a CI runner has no XDG_RUNTIME_DIR: importing the embedded server's
    # package made platformdirs warn about it on every command's stderr.
    env = {
        k: v for k, v in os.environ.items() if k not in ("OUTBOX_DATABASE_URL", "XDG_RUNTIME_DIR")
    }
    env["OUTBOX_HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "outbox.commands", *command],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=30,
    )
    err = done.stderr.decode()
    assert "Warning" not in err and "XDG_RUNTIME_DIR" not in err, err
