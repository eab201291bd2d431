"""``pytest --cpu-report=FILE``: CPU seconds per test, to find what makes the suite slow.

On a machine shared with other work, wall time says little; CPU seconds do not depend on the
load. For each test (its setup, call and teardown) this records the CPU of the test's process
and of the children it waited for (``getrusage``), of the relays it forked and their fork
server (``tests/forked.py``, from ``/proc``), and the CPU of the process's private
PostgreSQL server: the postmaster, the backends it reaped and the ones alive
(``/proc/PID/stat``). The session-scoped fixtures (a server's initdb and start, the template's
migrations) are counted apart, as ``fixture:NAME``, and so is the process's start (interpreter,
plugins, conftest imports) as ``startup``.

Each process (each pytest-xdist worker) writes its lines (JSON) to ``FILE.<worker>``; the
process that started the run prints the 30 most costly tests and the totals, and writes all
rows, most costly first, to ``FILE``. A server named by ``OUTBOX_TEST_DATABASE_URL`` (or a
container) is shared or remote: its CPU is not counted. Processes a test started and did not
wait for (a relay left running) are not counted either.
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

TICK = os.sysconf("SC_CLK_TCK")


def _rusage() -> float:
    total = _forked()
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


_last_forked = 0.0


def _forked() -> float:
    """CPU of this process's fork server (``tests/forked.py``) and of the relays it forked
    and reaped: not this process's children, so not in its ``getrusage``. Kept after the
    server has gone."""
    global _last_forked
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    fields = _stat(pid) if pid else None
    if fields is not None:  # utime stime cutime cstime are fields 14-17
        _last_forked = sum(int(f) for f in fields[11:15]) / TICK
    return _last_forked


def _stat(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from the 3rd (state) on


_last_server: dict[int, float] = {}


def _server() -> float:
    """CPU of the private servers: postmasters with their reaped and live children. A server
    that has stopped keeps its last reading (its stop is not counted)."""
    from tests.servers import POSTMASTERS

    if not POSTMASTERS:
        return 0.0
    live: dict[int, float] = {}
    for pid in POSTMASTERS:
        fields = _stat(pid)
        if fields is not None:  # utime stime cutime cstime are fields 14-17
            live[pid] = sum(int(f) for f in fields[11:15]) / TICK
    if live:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            fields = _stat(entry)
            if fields is not None and int(fields[1]) in live:
                live[int(fields[1])] += (int(fields[11]) + int(fields[12])) / TICK
    _last_server.update(live)
    return sum(_last_server.values())


def _start() -> tuple[float, float]:
    server = _server()
    return _rusage(), server  # this process's CPU from after its look at /proc


def _end() -> tuple[float, float]:
    return _rusage(), _server()  # ... to before the next: a look costs about 5 ms


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        help="record CPU seconds per test (pytest tree and its PostgreSQL) to FILE; "
        "prints the 30 most costly",
    )


class Recorder:
    def __init__(self, path: Path, worker: str) -> None:
        self.out = open(f"{path}.{worker}", "w")  # noqa: SIM115 - open for the session
        self.fixture_cpu = self.fixture_pg = 0.0
        self.write("startup", _rusage(), 0.0)

    def write(self, name: str, cpu: float, server: float) -> None:
        self.out.write(json.dumps({"test": name, "cpu": cpu, "pg": server}) + "\n")
        self.out.flush()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any) -> Generator[None, Any, None]:
        if fixturedef.scope == "function":
            yield
            return
        before = _start()
        yield
        after = _end()
        self.write(f"fixture:{fixturedef.argname}", after[0] - before[0], after[1] - before[1])
        self.fixture_cpu += after[0] - before[0]
        self.fixture_pg += after[1] - before[1]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, Any, None]:
        self.fixture_cpu = self.fixture_pg = 0.0
        before = _start()
        yield
        after = _end()
        cpu = after[0] - before[0] - self.fixture_cpu
        self.write(item.nodeid, cpu, after[1] - before[1] - self.fixture_pg)

    def pytest_sessionfinish(self) -> None:
        cpu, server = _end()
        self.write("total", cpu, server)
        self.out.close()


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--cpu-report")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None or config.getoption("numprocesses", None) in (None, 0):
        config.pluginmanager.register(Recorder(Path(path), worker or "main"), "cpu-recorder")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    path = config.getoption("--cpu-report")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rows: list[dict[str, Any]] = []
    totals = {"cpu": 0.0, "pg": 0.0}
    for part in sorted(Path(path).parent.glob(Path(path).name + ".*")):
        for line in part.read_text().splitlines():
            row = json.loads(line)
            if row["test"] == "total":
                totals["cpu"] += row["cpu"]
                totals["pg"] += row["pg"]
            else:
                rows.append(row)
        part.unlink()
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:  # fixtures and startup: summed over the processes
        into = merged.setdefault(row["test"], {"test": row["test"], "cpu": 0.0, "pg": 0.0, "n": 0})
        into["cpu"] += row["cpu"]
        into["pg"] += row["pg"]
        into["n"] += 1
    ordered = sorted(merged.values(), key=lambda r: -(r["cpu"] + r["pg"]))
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in ordered))
    tests = [r for r in ordered if "::" in r["test"]]
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds (pytest process + children waited for, PostgreSQL)")
    for row in ordered[:30]:
        write(f"{row['cpu'] + row['pg']:7.2f} {row['cpu']:7.2f} {row['pg']:6.2f}  {row['test']}")
    write(
        f"tests: {len(tests)}, {sum(r['cpu'] for r in tests):.1f} s in the pytest processes, "
        f"{sum(r['pg'] for r in tests):.1f} s in PostgreSQL; "
        f"with startup and fixtures, per process: {totals['cpu']:.1f} s + {totals['pg']:.1f} s"
    )
    if config.getoption("numprocesses", None):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        write(f"the controlling process (pytest-xdist): {usage.ru_utime + usage.ru_stime:.1f} s")
    write(f"all rows: {path}")
