"""A fork server for the MCP servers the tests start: ``python tests/mcp_forks.py SOCKET``.

Starting a server built on the MCP SDK costs about 0.6 s of CPU, nearly all of it the SDK's
imports. This process imports the SDK once and forks a child for each server a test asks
for; each server is still a process of its own, which a test or a relay stops, kills or
loses like any other. A child runs a script (``tests/mcp_fixture.py``,
``tests/mcp_bad_schema.py``) as ``python SCRIPT ARGS...`` would, or ``-c CODE``.

Two ways in:

- Lines of JSON on stdin, each answered with a line on stdout: ``["start", LOG, SCRIPT,
  ARGS...]`` forks a server whose output goes to the file LOG (stdin: ``/dev/null``) and
  answers its pid; ``["poll", PID]`` answers ``running`` or its exit code; ``["wait",
  PID]`` its exit code once it has ended. At the end of stdin every child left is killed.
- A connection on the Unix socket SOCKET from ``tests/mcp_launch.py``, the command a relay
  or ``outbox mcp add`` starts for a stdio server: it sends the script's arguments with its
  stdin, stdout and stderr, and the child forked for it serves on those (the relay's pipes).
  The launcher hears the child's pid, then its exit code when it ends, and exits with it;
  if the launcher is killed or ends first, the child is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback

# What the servers import, paid here once.
import mcp.server.lowlevel
import mcp.server.mcpserver
import mcp.server.stdio  # noqa: F401
import mcp_types  # noqa: F401

ENDED_POLL_S = 0.05  # how often the children of launchers are looked at while any run


def run(argv: list[str]) -> None:
    """As ``python ARGV...`` would."""
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def fork(argv: list[str], fds: list[int], keep_closed: list[socket.socket]) -> int:
    """A child running ``argv`` with ``fds`` as its stdin, stdout and stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid != 0:
        return pid
    code = 0
    try:
        for sock in keep_closed:
            sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        run(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    raise AssertionError("unreachable")


def main(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "stdin")
    selector.register(listener, selectors.EVENT_READ, "launch")
    started: set[int] = set()  # children asked for on stdin
    launched: dict[int, socket.socket] = {}  # children of launchers, with their connection
    pending = b""
    while True:
        for key, _ in selector.select(ENDED_POLL_S if launched else None):
            if key.data == "stdin":
                chunk = os.read(0, 65536)
                if not chunk:
                    for pid in started | set(launched):
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    verb, *words = json.loads(line)
                    if verb == "start":
                        log = os.open(words[0], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                        null = os.open(os.devnull, os.O_RDONLY)
                        pid = fork(words[1:], [null, log, log], [listener, *launched.values()])
                        os.close(log)
                        os.close(null)
                        started.add(pid)
                        answer = str(pid)
                    else:
                        pid = int(words[0])
                        done, status = os.waitpid(pid, 0 if verb == "wait" else os.WNOHANG)
                        if done:
                            started.discard(pid)
                        answer = str(os.waitstatus_to_exitcode(status)) if done else "running"
                    os.write(1, answer.encode() + b"\n")
            elif key.data == "launch":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 65536, 3)
                pid = fork(json.loads(message), fds, [listener, conn, *launched.values()])
                for fd in fds:
                    os.close(fd)
                conn.sendall(b"%d\n" % pid)
                launched[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            else:  # the launcher went (killed, or stopped by whoever started it)
                selector.unregister(key.fileobj)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(key.data, signal.SIGKILL)
        for pid, conn in list(launched.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(OSError):
                    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
                with contextlib.suppress(KeyError):  # not when its launcher went first
                    selector.unregister(conn)
                conn.close()
                del launched[pid]


if __name__ == "__main__":
    main(sys.argv[1])
