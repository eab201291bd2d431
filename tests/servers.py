"""Private embedded PostgreSQL servers for the tests: one per pytest-xdist worker, in memory.

``make test`` runs the suite in several worker processes (pytest-xdist). Each worker starts a
server of its own, so a test that looks at a whole server (its backends in
``pg_stat_activity``, its locks, its ``LISTEN`` channels) sees only its own worker's tests, and
no worker waits on another's ``CREATE DATABASE``.

Its data folder is in memory (``/dev/shm`` when the machine has one, else under
``$OUTBOX_HOME``) and it runs with ``fsync`` and full-page writes off: a test server's data
need not survive a power cut, and the database cloned for every test then costs a copy in
memory instead of flushes to disk. These settings are only ever applied to a server made
here, never to one named by ``OUTBOX_TEST_DATABASE_URL``.

A session that is killed cannot stop its server: the next session stops and removes every
server whose owning process is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from outbox import db

MEMORY = Path("/dev/shm")
OWNER = "owner.pid"  # the pid of the process that started the server in this folder
# Durability a test server does without (each is reloadable, no restart needed).
SETTINGS = {"fsync": "off", "full_page_writes": "off"}
POSTMASTERS: list[int] = []  # of the servers this process started (``--cpu-report`` reads them)


def root() -> Path:
    """The folder of this checkout's test servers (one checkout's never meet another's)."""
    usable = MEMORY.is_dir() and os.access(MEMORY, os.W_OK)
    base = MEMORY if usable else db.home()
    digest = hashlib.sha256(str(db.home()).encode()).hexdigest()[:10]
    return base / f"outbox-tests-{digest}"


@contextmanager
def private_server(name: str) -> Iterator[tuple[db.EmbeddedServer, str]]:
    """A new embedded server in a folder of its own named after ``name``; yields the server
    and the URL of a maintenance database on it; stopped and removed after the block."""
    folder = root()
    folder.mkdir(parents=True, exist_ok=True)
    remove_abandoned(folder)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=folder))
    # Written whole or not at all: another process's remove_abandoned must never read an
    # empty owner file (a dead owner: it would remove this server's folder while it starts).
    (work / "owner.tmp").write_text(str(os.getpid()))
    os.replace(work / "owner.tmp", work / OWNER)
    server = db.EmbeddedServer(work / "pgdata")
    try:
        url = server.start()
        POSTMASTERS.append(int((work / "pgdata" / "postmaster.pid").read_text().split()[0]))
        with psycopg.connect(url, autocommit=True) as conn:
            for setting, value in SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {setting} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        yield server, url
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def remove_abandoned(folder: Path) -> None:
    """Stop and remove the servers under ``folder`` whose owning process has ended."""
    for work in folder.iterdir():
        try:
            pid = int((work / OWNER).read_text())
        except (OSError, ValueError):  # a folder being made, or not one of ours
            continue
        if _alive(pid):
            continue
        with contextlib.suppress(Exception):  # a half-made folder has no server to stop
            db.EmbeddedServer(work / "pgdata").stop()
        shutil.rmtree(work, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
