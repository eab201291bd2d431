"""`outbox` commands as processes forked from one that has imported their libraries.

A relay started as ``python -m outbox.commands relay`` spends about 0.45 s of CPU importing
(psycopg, pydantic, click, cryptography, jsonschema, OpenTelemetry) before it does
anything, and the suite starts dozens. Here each test process keeps a multiprocessing fork
server that imports the command's modules once; every command is a fork of it: a process
of its own, with its own pid, signals, exit status and ``kill -9``, running the same command
line through the same ``main``. The fork drops this project's modules and imports them
afresh (about 0.04 s), so what they read from the environment at import (a failpoint, the
model's timeout) comes from the command's own environment, as in a new process.

The tests of the command as a user starts it (the README's blocks, the CLI, the demo, the
embedded server, ``outbox.testing.relay``) still start ``python -m outbox.commands``.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

# The command's modules, imported once by the fork server; their libraries stay imported
# in every fork, this project's modules do not.
PRELOAD = [
    "outbox.commands.main",
    "outbox.commands.common",
    "outbox.commands.relay",
    "outbox.relay.engine",
    "outbox.relay.worker",
    "outbox.relay.supervisor",
    "outbox.relay.executors",
    "outbox.relay.spans",
]
OURS = ("outbox", "relay", "server", "commands", "cli")

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


class Forked:
    """The part of ``subprocess.Popen`` the tests use, for a forked command."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str]) -> None:
        self._process = process
        self.args = args
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(args: list[str], env: dict[str, str], cwd: Path, log_path: Path | None = None) -> Forked:
    """``outbox ARGS`` with exactly ``env`` as its environment, in ``cwd`` (first on its
    import path, as for ``python -m``); its output is appended to ``log_path`` (else it goes
    to this process's)."""
    if log_path is not None:
        log_path.touch()  # there when this returns, as a Popen's log file is
    process = _context.Process(
        target=_run, args=(args, env, str(cwd), str(log_path) if log_path else None)
    )
    process.start()
    return Forked(process, ["outbox", *args])


def _run(args: list[str], env: dict[str, str], cwd: str, log_path: str | None) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in OURS]:
        del sys.modules[name]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    if log_path is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    sys.argv = ["outbox", *args]
    from outbox.commands.main import main

    try:
        main(args=args, prog_name="outbox")
    finally:
        # A fork of multiprocessing ends with os._exit: the exit handlers a process runs
        # (the trace exporter's last flush, logging's) run here.
        atexit._run_exitfuncs()
