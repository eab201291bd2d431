"""Runs in flight: N agent runs at once, each model turn (M s) -> K tool calls (T s) -> turn.

Agent work is latency-bound, so what sizes a platform is how many runs it holds in flight,
not calls per second. N runs are started by the writer API (their first model turns queued),
then one relay process is started as users start it, with ``--concurrency C``; the model and
the tool are ``bench.latency_server`` in a process of their own. The clock starts at the
relay's first lease and stops when every run is completed. The ideal is ``2M + T``: every
run's three steps, back to back, all runs at once. ``measure(..., live=C)`` starts them
instead as a service does, once the relay listens: a transaction a run from C connections
at once, the clock started with the first (``bench.clients`` compares ``outbox serve``
with it).

Also read, while it runs: the most database connections the relay held (from
``pg_stat_activity``, by application name), the relay's CPU seconds and its peak memory
(RSS, with psutil; per run in flight: the peak less the idle process, over N), and the
duplicate effects the tool counted by idempotency key (must be 0).
"""

from __future__ import annotations

import functools
import math
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import psutil
import psycopg

from bench import db as bdb
from bench import seed
from bench.throughput import REPO, stderr
from outbox import writer
from outbox.constants import ACTIVE
from outbox.relay.config import RelayConfig
from outbox.schemas import StartRun

TOOL = "slow"
SAMPLE_S = 0.25  # how often connections and memory are sampled
SEED_COMMIT_EVERY = 500  # runs started per writer transaction
TIMEOUT_FACTOR = 20  # give up after this many ideal walls (and at least two minutes)
# The share of the open-files limit the relay's places may take (each may hold a socket):
# 12,000 of the 20,000 files a process may open here.
CONCURRENCY_SHARE_OF_FILES = 0.6
LISTENING = (  # the relay's listener is connected and waits for new rows
    "EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
    " AND application_name = 'outbox-relay-listen' AND state = 'idle')"
)
ACTIVE_RUN_LEFT = (  # a run not ended yet (runs_one_active_per_thread holds just those)
    "SELECT EXISTS (SELECT 1 FROM outbox.runs WHERE status IN ("
    + ", ".join(f"'{status}'" for status in ACTIVE)
    + "))"
)
SETTLED_TIME_WAIT = 1000  # a case starts once the host has at most this many sockets closing


class LatencyServer:
    """``bench.latency_server`` in its own process."""

    def __init__(
        self,
        model_s: float,
        tool_s: float,
        calls: int,
        model_status: int = 200,
        tool_name: str = TOOL,
    ) -> None:
        command = [sys.executable, "-m", "bench.latency_server", "--model-latency", str(model_s)]
        command += ["--tool-latency", str(tool_s), "--calls", str(calls)]
        command += ["--model-status", str(model_status), "--tool-name", tool_name]
        self.process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().decode().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("the latency server did not start")

    def stats(self) -> dict[str, Any]:
        response = httpx2.get(self.url + "/_stats", timeout=30)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def start_runs(url: str, n: int, base_url: str) -> None:
    """``n`` runs of one user message each, their first model turns queued."""
    printer = seed.progress_printer("starting runs", n)
    with psycopg.connect(url) as conn:
        conn.execute("SET outbox.notify = 'off'")  # the relay is not running yet
        for i in range(n):
            start_run(conn, i, base_url)
            if (i + 1) % SEED_COMMIT_EVERY == 0 or i + 1 == n:
                conn.commit()
                printer(i + 1)


def start_run(conn: psycopg.Connection[Any], i: int, base_url: str) -> None:
    """Run ``i``: a thread with one user message, and its run asking for ``TOOL``."""
    thread = writer.create_thread(conn, seed.TENANT)
    writer.start_run(
        conn,
        StartRun(
            tenant_id=seed.TENANT,
            thread_id=thread.id,
            model="bench",
            base_url=base_url,
            message=f"run {i}",
            tools=[TOOL],
        ),
    )


def start_runs_live(url: str, n: int, base_url: str, connections: int) -> tuple[float, float]:
    """``n`` runs as a service starts them while a relay is running: a transaction each
    (a thread, its user message, its run), from ``connections`` connections at once, a
    thread each; returns the seconds until the last one committed, and the CPU seconds
    the threads spent (what the server spends on its creates, in Python)."""
    started = time.perf_counter()
    numbers = iter(range(n))
    lock = threading.Lock()
    errors: list[BaseException] = []
    cpu: list[float] = []

    def start() -> None:
        before = time.thread_time()
        try:
            with psycopg.connect(url) as conn:
                while True:
                    with lock:
                        i = next(numbers, None)
                    if i is None:
                        return
                    start_run(conn, i, base_url)
                    conn.commit()
        except BaseException as err:
            errors.append(err)
        finally:
            cpu.append(time.thread_time() - before)

    threads = [threading.Thread(target=start) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started, sum(cpu)


class Sampler(threading.Thread):
    """Samples the relays' database connections and memory (their sum) until stopped."""

    def __init__(self, url: str, relays: list[psutil.Process]) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.relays = relays
        self.stop = threading.Event()
        self.max_connections = 0
        self.max_rss = 0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(SAMPLE_S):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'outbox-relay-%%' AND datname = current_database()"
                ).fetchone()
                self.max_connections = max(self.max_connections, int(row[0]) if row else 0)
                self.max_rss = max(self.max_rss, sum(rss(relay) for relay in self.relays))


def rss(process: psutil.Process) -> int:
    try:
        return int(sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]))
    except psutil.Error:
        return 0


def postmaster_of(conn: psycopg.Connection[Any]) -> psutil.Process | None:
    """The PostgreSQL server's postmaster, when it runs on this machine (else None)."""
    try:
        backend = psutil.Process(conn.info.backend_pid)
        if backend.name() not in ("postgres", "postmaster"):  # a pid of another machine
            return None
        return backend.parent()
    except psutil.Error:
        return None


def postgres_cpu_s(postmaster: psutil.Process | None) -> float:
    """CPU seconds PostgreSQL spent so far: its postmaster, every backend and process it
    runs, and those that ended (reaped by the postmaster); NaN when it runs elsewhere."""
    if postmaster is None:
        return float("nan")
    times = postmaster.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in postmaster.children():
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue
        total += child_times.user + child_times.system
    return float(total)


def postgres_cpu_by_kind(postmaster: psutil.Process | None) -> dict[str, float]:
    """``postgres_cpu_s`` apart by what spent it, from each process's title: the backends
    (the statements), autovacuum, the checkpointer, WAL writer and background writer, I/O
    workers, and the processes that ended since the server started (reaped: autovacuum
    workers above all, and the backends of closed connections)."""
    if postmaster is None:
        return {}
    times = postmaster.cpu_times()
    kinds = {
        "postmaster": times.user + times.system,
        "ended": times.children_user + times.children_system,
    }
    for child in postmaster.children():
        try:
            title = " ".join(child.cmdline())
            child_times = child.cpu_times()
        except psutil.Error:
            continue
        kind = _postgres_kind(title)
        kinds[kind] = kinds.get(kind, 0.0) + child_times.user + child_times.system
    return kinds


def _postgres_kind(title: str) -> str:
    name = title.removeprefix("postgres: ")
    for kind in ("autovacuum", "checkpointer", "walwriter", "background writer", "io worker"):
        if name.startswith(kind):
            return kind
    return "backends" if "(" in name or "[local]" in name else "other"


def cpu_s(process: psutil.Process) -> float:
    """The relay's CPU seconds: its process and its workers, not the trace exporter it may
    have started beside it (``exporter_cpu_s``)."""
    return _tree_cpu(process)[0]


def exporter_cpu_s(process: psutil.Process) -> float:
    """The CPU seconds of the trace exporter the relay started (``outbox traces export``)."""
    return _tree_cpu(process)[1]


def _tree_cpu(process: psutil.Process) -> tuple[float, float]:
    relay = exporter = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
            is_exporter = "traces" in p.cmdline()
        except psutil.Error:
            continue
        if is_exporter:
            exporter += times.user + times.system
        else:
            relay += times.user + times.system
    return relay, exporter


def measure(
    server: str,
    runs: int,
    model_s: float,
    tool_s: float,
    calls: int,
    concurrency: int,
    log_path: Path,
    processes: int = 1,
    env: dict[str, str] | None = None,
    drain_spans: bool = False,
    live: int = 0,
) -> dict[str, Any]:
    """One measurement; returns its figures (see the module docstring). ``env``: more of
    the relay's environment (``bench.tracing`` switches tracing on with it); with
    ``drain_spans``, after the runs, wait for the trace exporter to export every run's
    spans and count its CPU and the database's until then too. With ``live``
    (connections), the runs are started once the relay listens, a transaction each from
    that many connections at once (``start_runs_live``), and the clock starts with the
    first: what a service that writes its runs itself sees, where by default they are all
    queued before the relay starts and the clock starts at its first lease."""
    ideal = 2 * model_s + tool_s
    settle_sockets()
    latency = LatencyServer(model_s, tool_s, calls)
    try:
        with bdb.scratch(server, f"inflight_{runs}") as url:
            seed.register_http_tool(url, TOOL, latency.url + "/tools/" + TOOL, timeout_s=60)
            if not live:
                start_runs(url, runs, latency.url + "/v1")
            relay_env = {**os.environ, **(env or {})}
            relay_env.update(OUTBOX_DATABASE_URL=url, PYTHONPATH=str(REPO))
            command = [
                sys.executable,
                "-m",
                "outbox.commands",
                "relay",
                "--concurrency",
                str(concurrency),
            ]
            command += ["--processes", str(processes), "--log-level", "WARNING"]
            with open(log_path, "ab") as log:
                relay = subprocess.Popen(command, cwd=REPO, env=relay_env, stdout=log, stderr=log)
            try:
                starts = None
                if live:  # once the relay listens for new rows
                    with psycopg.connect(url, autocommit=True) as conn:
                        _until(conn, LISTENING, relay, log_path)
                    starts = functools.partial(
                        start_runs_live, url, runs, latency.url + "/v1", live
                    )
                figures = _watch(url, relay, runs, ideal, log_path, drain_spans, starts)
            finally:
                if relay.poll() is None:
                    relay.terminate()
                    relay.wait(timeout=60)
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'), "
                    "(SELECT count(*) FROM outbox.outbox WHERE status = 'quarantined') "
                    "FROM outbox.runs"
                ).fetchone()
            assert row is not None
            figures["completed"], figures["quarantined"] = int(row[0]), int(row[1])
        stats = latency.stats()
    finally:
        latency.close()
    figures.update(
        runs=runs,
        model_s=model_s,
        tool_s=tool_s,
        calls=calls,
        concurrency=concurrency,
        processes=processes,
        ideal_s=ideal,
        vs_ideal=round(ideal / figures["wall_s"], 3),
        duplicates=stats["duplicate_effects"],
        max_open_model=stats["max_open_model"],
        max_open_tool=stats["max_open_tool"],
    )
    return figures


def settle_sockets(deadline_s: float | None = None) -> None:
    """Wait until the sockets an earlier case closed have left TIME_WAIT (Linux keeps them
    60 s). A case right after another found ~18,000 of them holding local ports, and with
    most of the range taken every new connection's port search cost the kernel more: the
    second case measured the first one's leftovers. At most ``OUTBOX_BENCH_SETTLE_S``
    seconds (default 90); 0 skips the wait, as the smoke tests of the test suite do: their
    tiny cases measure nothing, and the suite around them keeps thousands of sockets
    closing, so each waited a minute or more."""
    if deadline_s is None:
        deadline_s = float(os.environ.get("OUTBOX_BENCH_SETTLE_S", "90"))
    deadline = time.monotonic() + deadline_s
    announced = False
    while (waiting := _time_wait_sockets()) > SETTLED_TIME_WAIT and time.monotonic() < deadline:
        if not announced:
            stderr(f"  waiting for {waiting} sockets of the last case to leave TIME_WAIT")
            announced = True
        time.sleep(1)


def _time_wait_sockets() -> int:
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                count += sum(1 for line in lines if line.split()[3:4] == ["06"])
        except OSError:  # not Linux: nothing to wait for
            pass
    return count


def _watch(
    url: str,
    relay: subprocess.Popen[bytes],
    runs: int,
    ideal: float,
    log_path: Path,
    drain_spans: bool = False,
    starts: Callable[[], tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The figures of the runs' drain, clocked from the relay's first lease; or, given
    ``starts`` (which starts the runs and returns when the last was stored, with its CPU
    seconds), from the call of ``starts``."""
    process = psutil.Process(relay.pid)
    stored_after = starts_cpu = None
    with psycopg.connect(url, autocommit=True) as conn:
        if starts is None:
            _until(
                conn,
                "EXISTS (SELECT 1 FROM outbox.outbox WHERE status = 'leased')",
                relay,
                log_path,
            )
        started = time.perf_counter()
        idle_rss, cpu_before = rss(process), cpu_s(process)
        postmaster = postmaster_of(conn)
        exporter_before, pg_before = exporter_cpu_s(process), postgres_cpu_s(postmaster)
        sampler = Sampler(url, [process])
        sampler.start()
        if starts is not None:
            stored_after, starts_cpu = (round(x, 2) for x in starts())
        deadline = time.monotonic() + max(120.0, TIMEOUT_FACTOR * ideal)
        # Whether a run is still active, from the partial index of the active runs: a
        # count of the completed ones every 50 ms read the whole runs table, a cost in
        # PostgreSQL's CPU per run that grew with the runs in flight (bench.statements).
        while conn.execute(ACTIVE_RUN_LEFT).fetchone()[0]:  # type: ignore[index]
            if relay.poll() is not None or time.monotonic() > deadline:
                row = conn.execute(
                    "SELECT count(*) FROM outbox.runs WHERE status = 'completed'"
                ).fetchone()
                done = int(row[0]) if row else 0
                raise RuntimeError(f"{done} of {runs} runs completed; see {log_path}")
            time.sleep(0.05)
        wall = time.perf_counter() - started
        cpu = cpu_s(process) - cpu_before
        drained = None
        if drain_spans:
            while conn.execute(
                "SELECT EXISTS (SELECT 1 FROM outbox.runs WHERE agent_span_due)"
            ).fetchone()[0]:  # type: ignore[index]
                if relay.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the trace exporter did not drain; see {log_path}")
                time.sleep(0.05)
            drained = round(time.perf_counter() - started - wall, 2)
        exporter_cpu = exporter_cpu_s(process) - exporter_before
        pg_cpu = postgres_cpu_s(postmaster) - pg_before
        sampler.stop.set()
        sampler.join()
    return {
        "wall_s": round(wall, 2),
        "all_runs_stored_after_s": stored_after,
        "starts_cpu_s": starts_cpu,
        "relay_cpu_s": round(cpu, 2),
        "cpu_ms_per_run": round(1000 * cpu / runs, 2),
        "exporter_cpu_ms_per_run": round(1000 * exporter_cpu / runs, 2),
        "spans_drained_after_s": drained,
        "postgres_cpu_s": round(pg_cpu, 2),
        "max_db_connections": sampler.max_connections,
        "peak_rss_mb": round(sampler.max_rss / 2**20, 1),
        "kb_per_run_in_flight": round(max(0, sampler.max_rss - idle_rss) / 1024 / runs, 1),
    }


def _until(
    conn: psycopg.Connection[Any], holds: str, relay: subprocess.Popen[bytes], log_path: Path
) -> None:
    """Once the condition ``holds`` (SQL) holds; the relay must run meanwhile."""
    deadline = time.monotonic() + 120
    while not conn.execute(f"SELECT {holds}").fetchone()[0]:  # type: ignore[index]
        if relay.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the relay did not start; see {log_path}")
        time.sleep(0.01)


def concurrency_for(runs: int, calls: int) -> int:
    """The relay's ``--concurrency`` for a case: every step of every run in flight at once.
    One tenant may hold only ``tenant_share`` of it (the rest is kept for other tenants'
    rows), so at 10,000 places 500 of 10,000 model turns waited for a whole turn of others
    (5 s of the case's wall). At most ``max_concurrency()``: each place may hold a socket."""
    wanted = math.ceil(runs * calls / RelayConfig.tenant_share)
    return min(wanted, max_concurrency())


def open_files() -> int:
    """The files a process of this bench may open: its hard limit, which the bench raises
    its own to and its relays and fakes inherit (``ulimit -Hn``, raised by root or by the
    service manager's ``LimitNOFILE``)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else int(hard)


def max_concurrency() -> int:
    """The most places a relay of this bench takes: a share of ``open_files()``."""
    return int(open_files() * CONCURRENCY_SHARE_OF_FILES)


def run_cases(server: str, cases: list[tuple[int, float, float, int]], log: Path) -> list[Any]:
    """Each case is (runs, M, T, K); the relay may hold every effect of a step in flight."""
    results = []
    for runs, model_s, tool_s, calls in cases:
        concurrency = concurrency_for(runs, calls)
        stderr(f"runs in flight: {runs} runs, M={model_s}s, T={tool_s}s, K={calls}")
        figures = measure(server, runs, model_s, tool_s, calls, concurrency, log)
        stderr(
            f"  wall {figures['wall_s']} s against {figures['ideal_s']} s ideal "
            f"({figures['vs_ideal']}x), {figures['max_db_connections']} connections, "
            f"{figures['cpu_ms_per_run']} ms CPU per run, "
            f"{figures['kb_per_run_in_flight']} kB per run in flight, "
            f"{figures['duplicates']} duplicates"
        )
        results.append(figures)
    return results
