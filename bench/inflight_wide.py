"""``python -m bench.inflight_wide [--runs N] [--relays K] [--curve 1000,5000,...]``: runs
in flight at the platform's scale, tens of thousands at once, with the CPU of a run taken
apart.

Each run is a model turn, two parallel tool calls with an idempotency key, a model turn, as
in ``bench.inflight``, but spread so that no process runs out of open files (about 20,000
here, a socket each): the fake model and tool (``bench.latency_server``) run in ``--fakes``
processes, each serving its own share of the runs (run ``i`` posts to fake ``i % S``, and
calls the tool ``slow_<i % S>`` registered at that fake's URL), and ``--relays`` relay
processes share the queue, each started as users start one (``outbox relay --processes 1``).
The runs are started by the writer API before the relays start; the clock runs from the
first lease to the last run completed; the ideal is 2M + T.

Reported per case: wall against the ideal; CPU per run of the relays, of PostgreSQL (its
postmaster and every process under it, with psutil: the database must run on this machine)
and of the fakes, separately; the most database connections the relays held together
(``pg_stat_activity``, sampled); the relays' peak memory (summed RSS) and memory per run in
flight (the peak less the relays' memory at the first lease, over N); and duplicate effects,
each fake's count of idempotency keys seen twice (must be 0).

``--curve`` runs one case per point and writes a PNG of CPU per run (relays, PostgreSQL)
against runs in flight. ``--tracemalloc FRAMES`` traces the relays' Python heap
(``bench.relay_heap``) and prints what it held per run in flight, by traceback (the case's
CPU and memory figures are then not the relay's).

Without ``OUTBOX_DATABASE_URL`` the cases run on an embedded server of this bench's own
(``$OUTBOX_HOME``, default ``.outbox-wide``), started with ``max_connections`` for every
relay (``MAX_CONNECTIONS``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench import db as bdb
from bench import inflight, relay_heap, report, seed, statements
from bench.throughput import REPO, stderr
from outbox import writer
from outbox.schemas import ModelOptions, StartRun

CALLS = 2  # parallel tool calls of a run's first turn
# Shares of the open-files limit (inflight.open_files: 20,000 here unless raised): the
# default --relays, one process per half of it in runs (two sockets a run at most: its
# calls), and the default --fakes, one per three quarters of it in requests held open.
RUNS_PER_RELAY_SHARE_OF_FILES = 0.5
OPEN_PER_FAKE_SHARE_OF_FILES = 0.75
SEED_CONNECTIONS = 4  # writer connections starting the runs, a thread each
MAX_CONNECTIONS = "400"  # the embedded server's, for up to ~40 relay processes of 8
PROGRESS_S = 10.0  # seconds between progress lines while a case runs


def latencies(runs: int) -> tuple[float, float]:
    """The default (model, tool) seconds of a case: long enough that the runs are started
    and claimed well within one model turn, so that they are all in flight at once."""
    if runs <= 1_000:
        return 1.0, 0.2
    if runs <= 10_000:
        return 10.0, 1.0
    if runs <= 20_000:
        return 30.0, 3.0
    return 60.0, 5.0


def default_relays(runs: int) -> int:
    return max(1, math.ceil(runs / runs_per_relay()))


def default_fakes(runs: int) -> int:
    return max(1, math.ceil(runs * CALLS / open_per_fake()))


def runs_per_relay() -> int:
    return int(inflight.open_files() * RUNS_PER_RELAY_SHARE_OF_FILES)


def open_per_fake() -> int:
    return int(inflight.open_files() * OPEN_PER_FAKE_SHARE_OF_FILES)


def server_url() -> str:
    """``OUTBOX_DATABASE_URL``, else this bench's own embedded server."""
    url = os.environ.get("OUTBOX_DATABASE_URL")
    if url:
        return url
    home = Path(os.environ.get("OUTBOX_HOME") or REPO / ".outbox-wide")
    return bdb.own_server(home, {"max_connections": MAX_CONNECTIONS, **statements.SETTINGS})


def tool_of(shard: int) -> str:
    return f"{inflight.TOOL}_{shard}"


class Fakes:
    """``count`` latency servers, fake ``j`` answering with calls of ``tool_of(j)``."""

    def __init__(self, count: int, model_s: float, tool_s: float) -> None:
        self.servers: list[inflight.LatencyServer] = []
        try:
            for shard in range(count):
                server = inflight.LatencyServer(model_s, tool_s, CALLS, tool_name=tool_of(shard))
                self.servers.append(server)
        except BaseException:
            self.close()
            raise
        self.processes = [psutil.Process(s.process.pid) for s in self.servers]

    def cpu_s(self) -> float:
        total = 0.0
        for process in self.processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def stats(self) -> dict[str, Any]:
        """Each fake's counters summed, and the model requests each fake served."""
        summed: dict[str, Any] = {"model_requests_per_fake": []}
        for server in self.servers:
            stats = server.stats()
            summed["model_requests_per_fake"].append(stats["model_requests"])
            for name, value in stats.items():
                summed[name] = summed.get(name, 0) + int(value)
        return summed

    def close(self) -> None:
        for server in self.servers:
            server.close()


def start_runs(
    url: str, runs: int, fakes: Fakes, message_kb: float = 0, truncation: str = "auto"
) -> None:
    """``runs`` runs, run ``i`` on fake ``i % len(fakes)``, their first model turns queued
    (``SEED_CONNECTIONS`` threads, a transaction per ``inflight.SEED_COMMIT_EVERY`` runs);
    each user message ``message_kb`` kB long (the history every model turn posts), their
    ``truncation`` model option ``truncation`` (``auto``: compacted when over the window)."""
    options = ModelOptions(truncation="disabled") if truncation == "disabled" else ModelOptions()
    urls = [server.url for server in fakes.servers]
    padding = " " + "x" * int(1024 * message_kb) if message_kb else ""
    printer = seed.progress_printer("starting runs", runs)
    done = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def start(first: int) -> None:
        try:
            with psycopg.connect(url) as conn:
                conn.execute("SET outbox.notify = 'off'")  # the relays are not running yet
                batch = 0
                for i in range(first, runs, SEED_CONNECTIONS):
                    shard = i % len(urls)
                    thread = writer.create_thread(conn, seed.TENANT)
                    writer.start_run(
                        conn,
                        StartRun(
                            tenant_id=seed.TENANT,
                            thread_id=thread.id,
                            model="bench",
                            base_url=urls[shard] + "/v1",
                            message=f"run {i}{padding}",
                            tools=[tool_of(shard)],
                            model_options=options,
                        ),
                    )
                    batch += 1
                    if batch == inflight.SEED_COMMIT_EVERY or i + SEED_CONNECTIONS >= runs:
                        conn.commit()
                        with lock:
                            done[0] += batch
                            printer(done[0])
                        batch = 0
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(SEED_CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def start_relays(
    url: str, relays: int, concurrency: int, log_path: Path, heap: HeapTrace | None = None
) -> list[Any]:
    """``relays`` relay processes; with ``heap``, each traced (``bench.relay_heap``)."""
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    options = ["relay", "--processes", "1", "--concurrency", str(concurrency)]
    options += ["--log-level", "WARNING"]
    started = []
    with open(log_path, "ab") as log:
        for n in range(relays):
            command = [sys.executable, "-m", "outbox.commands", *options]
            if heap is not None:
                command = [sys.executable, "-m", "bench.relay_heap", str(heap.directory(n))]
                command += [str(heap.frames), *options]
            started.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log))
    return started


class HeapTrace:
    """The relays' heaps traced (``--tracemalloc``): snapshots at the first lease, once
    every first model turn was sent (all runs waiting for their model), once every tool
    call was (waiting for their tools), and at the peak, in ``root``."""

    SNAPSHOT_WAIT_S = 120.0  # a snapshot of a heap of a few hundred MB takes seconds

    def __init__(self, root: Path, frames: int) -> None:
        self.root, self.frames = root, frames

    def directory(self, relay: int) -> Path:
        return self.root / f"relay-{relay}"

    def take(self, relays: list[Any], number: int) -> None:
        """Snapshot ``number`` of every relay (a SIGUSR1 each), once written."""
        for relay in relays:
            relay.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + self.SNAPSHOT_WAIT_S
        for n in range(len(relays)):
            while not (self.directory(n) / f"{number}.snap").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"relay {n} wrote no heap snapshot {number}")
                time.sleep(0.05)

    def report(self, relays: int, runs: int) -> str:
        """Each relay's breakdown: all runs waiting, and the peak, against the first lease."""
        parts = []
        for n in range(relays):
            where = self.directory(n)
            share = math.ceil(runs / relays)
            for title, name in (
                ("every first turn sent", "2.snap"),
                ("every tool call sent", "3.snap"),
                ("peak", "peak.snap"),
            ):
                if (where / name).exists():
                    parts.append(f"relay {n}, {title}, against the first lease ({where}):")
                    parts.append(relay_heap.breakdown(where / "1.snap", where / name, share))
        return "\n".join(parts)


def measure(
    server: str,
    runs: int,
    relays: int,
    fakes_count: int,
    model_s: float,
    tool_s: float,
    log_path: Path,
    message_kb: float = 0,
    truncation: str = "auto",
    heap: HeapTrace | None = None,
    top: int | None = None,
) -> dict[str, Any]:
    """One case; its figures (the module docstring); with ``heap``, the relays' heaps
    traced (their CPU and memory figures are then not theirs); with ``top``, the costs of
    the statements run from the first lease (``statements``)."""
    ideal = 2 * model_s + tool_s
    concurrency = inflight.concurrency_for(math.ceil(runs / relays), CALLS)
    inflight.settle_sockets()
    fakes = Fakes(fakes_count, model_s, tool_s)
    try:
        with bdb.scratch(server, f"wide_{runs}") as url:
            for shard, fake in enumerate(fakes.servers):
                endpoint = f"{fake.url}/tools/{tool_of(shard)}"
                seed.register_http_tool(url, tool_of(shard), endpoint, timeout_s=120)
            start_runs(url, runs, fakes, message_kb, truncation)
            processes = start_relays(url, relays, concurrency, log_path, heap)
            try:
                figures = watch(url, processes, fakes, runs, ideal, log_path, heap, top)
            finally:
                for relay in processes:
                    if relay.poll() is None:
                        relay.terminate()
                for relay in processes:
                    relay.wait(timeout=60)
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed') FROM outbox.runs"
                ).fetchone()
            figures["completed"] = int(row[0]) if row else 0
        stats = fakes.stats()
    finally:
        fakes.close()
    figures.update(
        runs=runs,
        relays=relays,
        fakes=fakes_count,
        concurrency=concurrency,
        model_s=model_s,
        tool_s=tool_s,
        message_kb=message_kb,
        truncation=truncation,
        ideal_s=ideal,
        vs_ideal=round(ideal / figures["wall_s"], 3),
        duplicates=stats["duplicate_effects"],
        model_requests=stats["model_requests"],
        tool_requests=stats["tool_requests"],
        model_requests_per_fake=stats["model_requests_per_fake"],
    )
    return figures


def watch(
    url: str,
    relays: list[Any],
    fakes: Fakes,
    runs: int,
    ideal: float,
    log_path: Path,
    heap: HeapTrace | None = None,
    top: int | None = None,
) -> dict[str, Any]:
    """The figures of the runs' drain, clocked from the first lease to the last run done;
    with ``heap``, the relays' heap snapshots taken on the way; with ``top``, the
    statements' costs over that time."""
    processes = [psutil.Process(relay.pid) for relay in relays]

    def relay_cpu() -> float:
        return sum(inflight.cpu_s(process) for process in processes)

    def check_relays() -> None:
        for relay in relays:
            if relay.poll() is not None:
                raise RuntimeError(f"a relay exited ({relay.returncode}); see {log_path}")

    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 300
        while not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM outbox.outbox WHERE status = 'leased')"
        ).fetchone()[0]:  # type: ignore[index]
            check_relays()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no relay leased a row; see {log_path}")
            time.sleep(0.01)
        if heap is not None:
            heap.take(relays, 1)
        if top is not None:
            statements.reset(url)
        taken = 1 if heap is not None else 3  # the snapshots taken (HeapTrace)
        started = time.perf_counter()
        idle_rss = sum(inflight.rss(process) for process in processes)
        postmaster = inflight.postmaster_of(conn)
        relay_before, pg_before = relay_cpu(), inflight.postgres_cpu_s(postmaster)
        kinds_before = inflight.postgres_cpu_by_kind(postmaster)
        fakes_before = fakes.cpu_s()
        sampler = inflight.Sampler(url, processes)
        sampler.start()
        deadline = time.monotonic() + max(300.0, inflight.TIMEOUT_FACTOR * ideal)
        shown = time.monotonic()
        # Whether a run is still active, from the partial index of the active runs (a count
        # of the completed ones would read the whole table, on PostgreSQL's CPU); progress
        # comes from the fakes' counters, which cost the database nothing.
        while conn.execute(inflight.ACTIVE_RUN_LEFT).fetchone()[0]:  # type: ignore[index]
            check_relays()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the runs did not complete in time; see {log_path}")
            if taken < 3:
                assert heap is not None
                stats = fakes.stats()
                if taken == 1 and stats["model_requests"] >= runs:
                    taken = 2  # every run waits in its first model turn
                    heap.take(relays, taken)
                elif taken == 2 and stats["tool_requests"] >= CALLS * runs:
                    taken = 3  # ... then in its tool calls
                    heap.take(relays, taken)
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                stats = fakes.stats()
                stderr(
                    f"  {time.perf_counter() - started:6.0f} s: model requests "
                    f"{stats['model_requests']:,}/{2 * runs:,}, tool calls "
                    f"{stats['tool_requests']:,}/{CALLS * runs:,}, "
                    f"relays {sampler.max_rss / 2**20:,.0f} MB at most"
                )
            time.sleep(0.05)
        wall = time.perf_counter() - started
        relay_s = relay_cpu() - relay_before
        pg_s = inflight.postgres_cpu_s(postmaster) - pg_before
        kinds = inflight.postgres_cpu_by_kind(postmaster)
        fakes_s = fakes.cpu_s() - fakes_before
        sampler.stop.set()
        sampler.join()
    costs = statements.costs(list(statements.snapshot(url)), runs) if top is not None else []
    return {
        "statements": costs,
        "wall_s": round(wall, 2),
        "relay_cpu_ms_per_run": round(1000 * relay_s / runs, 3),
        "postgres_cpu_ms_per_run": round(1000 * pg_s / runs, 3),
        "fakes_cpu_ms_per_run": round(1000 * fakes_s / runs, 3),
        "postgres_cpu_ms_per_run_by_kind": {
            kind: round(1000 * (spent - kinds_before.get(kind, 0.0)) / runs, 3)
            for kind, spent in sorted(kinds.items())
        },
        "max_db_connections": sampler.max_connections,
        "peak_relay_rss_mb": round(sampler.max_rss / 2**20, 1),
        "kb_per_run_in_flight": round(max(0, sampler.max_rss - idle_rss) / 1024 / runs, 2),
    }


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| runs in flight | model / tools | relays · fakes | wall vs ideal | DB connections "
        "(peak) | CPU per run: relay · PostgreSQL · fakes | relay RSS peak · per run in "
        "flight | duplicates |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['runs']:,} | {r['model_s']:g} s / {r['tool_s']:g} s | {r['relays']} · "
            f"{r['fakes']} | {r['vs_ideal']}x ({r['wall_s']} s vs {r['ideal_s']:g} s) | "
            f"{r['max_db_connections']} | {r['relay_cpu_ms_per_run']} · "
            f"{r['postgres_cpu_ms_per_run']} · {r['fakes_cpu_ms_per_run']} ms | "
            f"{r['peak_relay_rss_mb']} MB · {r['kb_per_run_in_flight']} kB | "
            f"{r['duplicates']} |"
        )
    return "\n".join(lines)


def statements_table(costs: list[dict[str, Any]], top: int) -> str:
    """The ``top`` statements by execution time a run: calls, buffers and time."""
    lines = [
        f"  {'statement':<48} {'top':>3} {'calls/run':>9} {'buf/call':>8} "
        f"{'ms/call':>8} {'ms/run':>7}"
    ]
    for s in sorted(costs, key=lambda s: -float(s["exec_ms_per_run"]))[:top]:
        calls = float(s["calls_per_run"])
        per_call = float(s["exec_ms_per_run"]) / calls if calls else 0.0
        lines.append(
            f"  {s['statement'][:48]:<48} {'y' if s['toplevel'] else 'n':>3} {calls:>9} "
            f"{s['buffers_per_call']:>8} {per_call:>8.3f} {s['exec_ms_per_run']:>7}"
        )
    return "\n".join(lines)


def chart(results: list[dict[str, Any]], path: Path) -> Path:
    """CPU per run of the relays and of PostgreSQL against the runs in flight."""
    # Imported by name: the bench extra is optional, and mypy must pass without it.
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    runs = [r["runs"] for r in results]
    fig, axis = plt.subplots(figsize=(7, 4))
    for key, label in (
        ("relay_cpu_ms_per_run", "relays"),
        ("postgres_cpu_ms_per_run", "PostgreSQL"),
        ("fakes_cpu_ms_per_run", "fake model and tools"),
    ):
        axis.plot(runs, [r[key] for r in results], marker="o", label=label)
    axis.set_xscale("log")
    axis.set_xticks(runs, [f"{n:,}" for n in runs])
    axis.set_xlabel("runs in flight")
    axis.set_ylabel("CPU ms per run")
    axis.set_ylim(bottom=0)
    axis.set_title("CPU per run against runs in flight")
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.inflight_wide", description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000, help="runs in flight (10,000)")
    parser.add_argument(
        "--curve", help="runs in flight of each case, comma-separated (replaces --runs)"
    )
    parser.add_argument(
        "--relays",
        type=int,
        help=f"relay processes (default: one per {runs_per_relay():,} runs, half the "
        "open-files limit)",
    )
    parser.add_argument(
        "--fakes",
        type=int,
        help=f"fake model/tool processes (default: one per {open_per_fake():,} tool calls, "
        "three quarters of the open-files limit)",
    )
    parser.add_argument(
        "--model-s", type=float, help="model latency, seconds (default: by runs, 1 to 60)"
    )
    parser.add_argument(
        "--tool-s", type=float, help="tool latency, seconds (default: by runs, 0.2 to 5)"
    )
    parser.add_argument(
        "--message-kb",
        type=float,
        default=0,
        help="kB of each run's user message, the history its turns post (default: a few bytes)",
    )
    parser.add_argument(
        "--truncation",
        choices=["auto", "disabled"],
        default="auto",
        help="the runs' truncation option (auto: compacted when over the window, and a "
        "waiting turn keeps its history to send again; disabled: it lets go of it)",
    )
    parser.add_argument(
        "--tracemalloc",
        type=int,
        metavar="FRAMES",
        help="trace the relays' Python heap (FRAMES frames an allocation) and print what it "
        "held per run once every first turn was sent, and at its peak, against the first "
        "lease; the case's CPU and memory figures are then not the relay's",
    )
    parser.add_argument(
        "--statements",
        type=int,
        metavar="TOP",
        help="also print the TOP statements by execution time a run, with their calls, "
        "buffers and time a call (pg_stat_statements, reset at the first lease; the bench's "
        "own server loads it)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--chart", type=Path, help="the PNG of --curve (bench/results/...)")
    args = parser.parse_args(argv)
    args.points = [int(n) for n in args.curve.split(",")] if args.curve else [args.runs]
    if any(n < 1 for n in args.points):
        parser.error("runs in flight must be at least 1")
    if args.tracemalloc is not None and args.tracemalloc < 1:
        parser.error("--tracemalloc FRAMES must be at least 1 (25 shows the callers well)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the fakes, relays
    server = server_url()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    report.RESULTS.mkdir(exist_ok=True)
    log = report.RESULTS / f"relay-wide-{stamp}.log"
    results = []
    for runs in args.points:
        default_m, default_t = latencies(runs)
        model_s = default_m if args.model_s is None else args.model_s
        tool_s = default_t if args.tool_s is None else args.tool_s
        relays = args.relays or default_relays(runs)
        fakes = args.fakes or default_fakes(runs)
        stderr(
            f"{runs:,} runs in flight: M={model_s:g} s, T={tool_s:g} s, {relays} relay(s), "
            f"{fakes} fake(s); relay log {log}"
        )
        heap = None
        if args.tracemalloc:
            heap = HeapTrace(report.RESULTS / f"relay-heap-{stamp}-{runs}", args.tracemalloc)
        figures = measure(
            server,
            runs,
            relays,
            fakes,
            model_s,
            tool_s,
            log,
            args.message_kb,
            args.truncation,
            heap,
            args.statements,
        )
        if heap is not None:
            stderr(heap.report(relays, runs))
        stderr(
            f"  {figures['vs_ideal']}x ideal, CPU per run: relay "
            f"{figures['relay_cpu_ms_per_run']} ms, PostgreSQL "
            f"{figures['postgres_cpu_ms_per_run']} ms, fakes {figures['fakes_cpu_ms_per_run']} "
            f"ms; {figures['kb_per_run_in_flight']} kB per run in flight; "
            f"{figures['duplicates']} duplicates"
        )
        stderr(
            "  PostgreSQL CPU per run by process: "
            + ", ".join(
                f"{kind} {ms} ms" for kind, ms in figures["postgres_cpu_ms_per_run_by_kind"].items()
            )
        )
        if args.statements:
            stderr(statements_table(figures["statements"], args.statements))
        results.append(figures)
    print(markdown(results))
    if args.curve:
        png = args.chart or report.RESULTS / f"inflight-wide-{stamp}.png"
        stderr(f"chart: {chart(results, png)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
