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
from pathlib import Path

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


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes the embedded server's user")
def test_servers_started_at_once_by_root_make_one_system_user():
    """Workers that start embedded servers at the same moment on a machine without the
    server's system user must all get one and the same user: each creating its own left
    all but one chowning their data folder to a uid that no longer existed."""
    name = f"outbox_t{os.getpid()}"
    script = (
        "import sys; from outbox import db; print('ready', flush=True); sys.stdin.read(); "
        f"print(db.system_user_ready({name!r}))"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for child in children:  # wait until every child is past its imports...
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for child in children:  # ...then let them all go at once
            assert child.stdin is not None
            child.stdin.close()
        uids = {int(child.stdout.read()) for child in children if child.stdout is not None}
        assert [child.wait(timeout=60) for child in children] == [0] * 4
        passwd = Path("/etc/passwd").read_text().splitlines()
        entries = [line for line in passwd if line.startswith(f"{name}:")]
        assert len(entries) == 1, entries
        assert uids == {int(entries[0].split(":")[2])}
    finally:
        subprocess.run(["userdel", name], capture_output=True)
