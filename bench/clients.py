"""``outbox serve`` under its clients' load: waiting requests, and the Agents SDK's runs.

Two measurements, each beside the same work without the server:

- **waiting** (``python -m bench.clients waiting [N] [--no-writer] [--workers W]
  [--stream]``): N waiting ``responses.create`` (``--stream``: ``stream=true``, each read
  to its ``response.completed`` event) at once from one asyncio client, to ``outbox serve`` on
  its default ``--db-connections`` (``--workers W``, 1 by default) and one relay (each a
  process, as ``--with-relay`` runs them); each starts a run whose model
  (``bench.latency_server``) takes ``MODEL_S`` a turn and asks for one call of a
  registry tool that takes ``TOOL_S``, then answers:
  ideal ``2 MODEL_S + TOOL_S``. The wall runs from the first request sent to the last
  answer; beside it, the time from each run's completing commit (its ``NOTIFY
  outbox_runs``, as a listener of the bench sees it) to its answer (as the client sees
  it), and the most database connections the server held (its pool and its LISTEN).
  Then, unless ``--no-writer``, the same N runs started through the writer API and
  drained by one relay (``bench.inflight``) twice: queued before the relay starts
  (clocked from its first lease), and started live beside it, a transaction a run from
  as many connections as the server's (``--db-connections`` a worker) at once (clocked
  from the first start: the same arrival as the server's, so the ratio to it is what
  the HTTP surface adds). The server is held to within 1.25x.
- **agents** (``python -m bench.clients agents [N]``): the same OpenAI Agents SDK agent (one
  local function tool of ``TOOL_S``, an ``asyncio.sleep``) run N times at once in one
  asyncio process, with ``Runner.run`` in the SDK's default mode, against ``outbox serve``
  and its relay and against the same model directly (``OpenAIResponsesModel`` over one
  ``AsyncOpenAI`` client each, one run of each before the clock): the wall of each,
  their ratio (the cost of durability), the most database connections the server held,
  and from the runs' journals where a served run's time went past the work itself: the
  relay's leg (a response stored to its model turn recorded) and the client's (a tool
  call intended to its output stored). Ideal: ``2 MODEL_S + TOOL_S``.
- **shed** (``python -m bench.clients shed [N] [--queue-timeout S]``, 1 s by default): N
  waiting ``responses.create`` at once through the openai SDK with its default retries, to
  a server whose queue timeout the burst outlasts: how many requests it refused (503
  ``server_busy``), whether each got its answer once resent, and that no run was started
  twice. Not a speed: what a burst past ``--queue-timeout`` costs its clients.

Each runs on the embedded server (or ``OUTBOX_DATABASE_URL``), in a scratch database.
With ``BENCH_PROFILE_SERVE=FILE``, py-spy (``pip install py-spy``) samples every thread
of the server while the requests run, into FILE (its raw format: one stack a line).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import psutil
import psycopg

from bench import db as bdb
from bench import inflight, seed
from bench.throughput import REPO, stderr
from outbox import db, keys
from outbox.server.db_pool import DB_CONNECTIONS

MODEL_S = 1.0  # seconds a model turn takes
TOOL_S = 0.5  # seconds the tool takes
TOOL = inflight.TOOL  # "slow": the latency server's model asks for it
DEADLINE_S = 300.0  # seconds a measurement may take before the bench gives up
SAMPLE_S = 0.1  # how often the server's connections are counted
START_S = 60.0  # seconds the server gets to answer
SERVER_NAME = "outbox-serve"  # the server's application_name on the database


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api_key(url: str, latency: inflight.LatencyServer | None = None) -> str:
    """A key of the bench's tenant on ``url``; with ``latency``, its tool registered first
    (the one the served runs' model asks for)."""
    if latency is not None:
        seed.register_http_tool(url, TOOL, latency.url + "/tools/" + TOOL, timeout_s=60)
    with psycopg.connect(url) as conn:
        _, key = keys.create_key(conn, seed.TENANT, name="bench")
        conn.commit()
    return key


@contextmanager
def serving(
    url: str, model_base_url: str, log: Path, workers: int = 1, *options: str
) -> Iterator[tuple[str, psutil.Process, psutil.Process]]:
    """``outbox serve`` on ``url`` (with ``options`` more) and one ``outbox relay``, each a
    process of its own (what ``outbox serve --with-relay`` starts, but the server's
    connections named apart from its relay's); yields the server's base URL once it
    answers, its process and the relay's."""
    port = _free_port()
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
    named = url + ("&" if "?" in url else "?") + f"application_name={SERVER_NAME}"
    serve = [sys.executable, "-m", "outbox.commands", "serve", "--port", str(port)]
    serve += ["--model-base-url", model_base_url, "--log-level", "warning"]
    serve += ["--workers", str(workers), *options]
    relay = [sys.executable, "-m", "outbox.commands", "relay", "--log-level", "WARNING"]
    with open(log, "ab") as out:
        processes = [
            subprocess.Popen(
                serve, cwd=REPO, env={**env, "OUTBOX_DATABASE_URL": named}, stdout=out, stderr=out
            ),
            subprocess.Popen(relay, cwd=REPO, env=env, stdout=out, stderr=out),
        ]
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                httpx2.get(base + "/responses/none", timeout=5)
                break
            except httpx2.HTTPError:
                if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"outbox serve or its relay did not start; see {log}"
                    ) from None
                time.sleep(0.1)  # polling a condition with a deadline
        spy = None
        if os.environ.get("BENCH_PROFILE_SERVE"):  # py-spy samples of the server's threads
            samples, pid = os.environ["BENCH_PROFILE_SERVE"], str(processes[0].pid)
            spy_bin = str(Path(sys.executable).parent / "py-spy")
            spy = subprocess.Popen(
                [spy_bin, "record", "--gil", "--threads", "-f", "raw", "-o", samples, "--pid", pid]
            )
        yield base, psutil.Process(processes[0].pid), psutil.Process(processes[1].pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=60)


class Connections(threading.Thread):
    """The most connections ``outbox serve`` held on the database at once, by
    ``application_name`` (its relay's are named ``outbox-relay-...``)."""

    def __init__(self, url: str, responses: int = 0) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.most: dict[str, int] = {}
        self.stop = threading.Event()
        self.responses = responses  # when this many responses are stored: all_stored_at
        self.all_stored_at: float | None = None  # perf_counter
        # What the server's connections were doing, sample by sample: how many were idle
        # in the pool, waiting on the server's Python in a transaction, running, or waiting
        # on a lock (state, and the wait event's type).
        self.doing: dict[str, int] = {}

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(SAMPLE_S):
                rows = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " GROUP BY 1"
                ).fetchall()
                for name, count in rows:
                    self.most[name] = max(self.most.get(name, 0), int(count))
                for (what,) in conn.execute(
                    "SELECT state || coalesce(' ' || wait_event_type, '') FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s",
                    [SERVER_NAME],
                ).fetchall():
                    self.doing[what] = self.doing.get(what, 0) + 1
                if self.responses and self.all_stored_at is None:
                    row = conn.execute("SELECT count(*) FROM outbox.responses").fetchone()
                    if row is not None and int(row[0]) >= self.responses:
                        self.all_stored_at = time.perf_counter()

    def server(self) -> int:
        """The most the server itself held (its pool and its LISTEN connection)."""
        return self.most.get(SERVER_NAME, 0)


class Commits(threading.Thread):
    """When each run's completion committed, as ``LISTEN outbox_runs`` sees its NOTIFY
    (delivered at the commit): epoch seconds by run id."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.at: dict[str, float] = {}
        self.stop = threading.Event()
        self.listening = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("LISTEN outbox_runs")
            self.listening.set()
            while not self.stop.is_set():
                for note in conn.notifies(timeout=0.2):
                    payload = json.loads(note.payload)
                    if payload["status"] == "completed":
                        self.at[payload["run_id"]] = time.time()


# -- waiting responses.create beside the writer API -----------------------------------------


def waiting(
    server: str,
    n: int,
    log: Path,
    with_writer: bool = True,
    workers: int = 1,
    stream: bool = False,
    client: str = "httpx",
) -> dict[str, Any]:
    """N waiting responses.create through ``outbox serve`` and a relay, then (unless not
    ``with_writer``) the same runs through the writer API and one relay (see the module's
    docstring). ``client``: who sends them (``CLIENTS``)."""
    ideal = 2 * MODEL_S + TOOL_S
    inflight.settle_sockets()
    latency = inflight.LatencyServer(MODEL_S, TOOL_S, 1)
    try:
        with bdb.scratch(server, f"clients_waiting_{n}") as url:
            key = _api_key(url, latency)
            with psycopg.connect(url) as conn:
                postmaster = inflight.postmaster_of(conn)
            with serving(url, latency.url + "/v1", log, workers) as (base, process, relay):
                watch, commits = Connections(url, n), Commits(url)
                watch.start()
                commits.start()
                commits.listening.wait(START_S)
                split = CpuSplit(process, relay, postmaster, latency.process.pid)
                started = time.perf_counter()
                wall, answered, client_cpu = asyncio.run(
                    _waiting_requests(base, key, n, stream, client)
                )
                cores = split.done(client_cpu)
                for thread in (watch, commits):
                    thread.stop.set()
                    thread.join()
            lags = _commit_to_answer(url, answered, commits.at)
        api = {
            "client": client,
            "wall_s": round(wall, 2),
            "vs_ideal": round(ideal / wall, 3),
            "commit_to_answer_p50_ms": round(1000 * statistics.median(lags), 1),
            "commit_to_answer_p99_ms": round(1000 * sorted(lags)[int(0.99 * (len(lags) - 1))], 1),
            "server_db_connections": watch.server(),
            "db_connections_by_name": watch.most,
            "all_responses_stored_after_s": None
            if watch.all_stored_at is None
            else round(watch.all_stored_at - started, 2),
            "server_cpu_s": cores["server"],
            "server_cpu_ms_per_request": round(1000 * cores["server"] / n, 2),
            "client_cpu_ms_per_request": round(1000 * cores["client"] / n, 2),
            "cpu_s": cores,
            "server_connections_doing": watch.doing,
        }
    finally:
        latency.close()
    stderr(f"  {n} waiting responses.create: {api}")
    if not with_writer:
        return {"runs": n, "ideal_s": ideal, "api": api}
    concurrency = inflight.concurrency_for(n, 1)
    writer = inflight.measure(server, n, MODEL_S, TOOL_S, 1, concurrency, log)
    stderr(f"  the same runs through the writer API, queued first: {writer['wall_s']} s")
    live = inflight.measure(  # as many connections as the server workers hold
        server, n, MODEL_S, TOOL_S, 1, concurrency, log, live=DB_CONNECTIONS * workers
    )
    stderr(f"  the same runs through the writer API, started live: {live['wall_s']} s")
    return {
        "runs": n,
        "ideal_s": ideal,
        "api": api,
        "writer_wall_s": writer["wall_s"],
        "api_vs_writer": round(api["wall_s"] / writer["wall_s"], 2),
        "writer_relay_cpu_s": writer["relay_cpu_s"],
        "writer_postgres_cpu_s": writer["postgres_cpu_s"],
        "live_writer_wall_s": live["wall_s"],
        "api_vs_live_writer": round(api["wall_s"] / live["wall_s"], 2),
        "live_writer_stored_after_s": live["all_runs_stored_after_s"],
        "live_writer_starts_cpu_s": live["starts_cpu_s"],
        "live_writer_relay_cpu_s": live["relay_cpu_s"],
        "live_writer_postgres_cpu_s": live["postgres_cpu_s"],
    }


class CpuSplit:
    """CPU seconds spent from its creation to ``done``, by process: the client (measured by
    its caller, the thread of its event loop), the server, the relay, PostgreSQL (the
    postmaster, every backend, and the backends that ended meanwhile: what the postmaster
    reaped), the model's and tool's latency server, the bench's own watchers, and the rest
    of the machine (other sessions' work, the kernel's)."""

    def __init__(
        self,
        server: psutil.Process,
        relay: psutil.Process,
        postmaster: psutil.Process | None,
        latency_pid: int,
    ) -> None:
        self.server, self.relay, self.postmaster = server, relay, postmaster
        self.latency = psutil.Process(latency_pid)
        self.before = self._now()

    def _now(self) -> dict[str, float]:
        machine = psutil.cpu_times()
        return {
            "bench_process": time.process_time(),
            "server": inflight.cpu_s(self.server),
            "relay": inflight.cpu_s(self.relay),
            "postgres": inflight.postgres_cpu_s(self.postmaster),
            "latency_server": inflight.cpu_s(self.latency),
            "machine_busy": machine.user
            + machine.nice
            + machine.system
            + machine.irq
            + machine.softirq
            + machine.steal,
            "wall": time.perf_counter(),
        }

    def done(self, client_s: float) -> dict[str, float]:
        after = self._now()
        spent = {name: after[name] - self.before[name] for name in after}
        # The bench process beside its client's thread: its watchers (and any thread the
        # client started).
        spent["bench_other_threads"] = spent.pop("bench_process") - client_s
        processes = ("server", "relay", "postgres", "latency_server", "bench_other_threads")
        ours = client_s + sum(spent[k] for k in processes)
        out = {"client": client_s, **{k: spent[k] for k in spent if k not in ("wall",)}}
        out["others"] = spent["machine_busy"] - ours
        out["cores_available"] = psutil.cpu_count() * spent["wall"]
        return {k: round(v, 2) for k, v in out.items()}


CLIENTS = ("httpx", "openai", "raw")  # who sends the waiting requests (--client)


async def _waiting_requests(
    base: str, key: str, n: int, stream: bool = False, client: str = "httpx"
) -> tuple[float, dict[str, float], float]:
    """N waiting responses.create at once; (wall, the epoch second each response answered:
    with ``stream``, its ``response.completed`` event; the CPU seconds of this thread, the
    client's event loop). ``client``: ``httpx`` (``httpx2.AsyncClient``, the default),
    ``openai`` (the openai SDK's ``AsyncOpenAI.responses.create``, as a user's code sends
    them) or ``raw`` (HTTP/1.1 written on asyncio's streams, one connection a request: next
    to no client CPU, to see the server's figures without the client's share of the cores)."""
    tool = {"type": "function", "name": TOOL, "parameters": {"type": "object"}}
    answered: dict[str, float] = {}

    def done(i: int, answer: dict[str, Any]) -> None:
        if answer["status"] != "completed" or answer["output"][-1]["type"] != "message":
            raise RuntimeError(f"response {i} did not complete: {answer}")
        answered[answer["id"]] = time.time()

    def body(i: int) -> dict[str, Any]:
        return {"model": "bench", "input": f"run {i}", "tools": [tool], "stream": stream}

    cpu = time.thread_time()
    if client == "openai":
        if stream:
            raise ValueError("--client openai measures waiting requests, not streams")
        from openai import AsyncOpenAI  # the dev extra's

        sdk = AsyncOpenAI(base_url=base, api_key=key, timeout=DEADLINE_S, max_retries=0)

        async def ask_sdk(i: int) -> None:
            made = await sdk.responses.create(
                model="bench",
                input=f"run {i}",
                tools=[tool],  # type: ignore[list-item]
            )
            done(i, made.model_dump())

        try:
            started = time.perf_counter()
            await asyncio.gather(*(ask_sdk(i) for i in range(n)))
            wall = time.perf_counter() - started
        finally:
            await sdk.close()
        return wall, answered, time.thread_time() - cpu
    if client == "raw":
        host, port = base.removeprefix("http://").split("/")[0].split(":")

        async def ask_raw(i: int) -> None:
            done(i, await _raw_post(host, int(port), "/v1/responses", key, body(i), stream))

        started = time.perf_counter()
        await asyncio.gather(*(ask_raw(i) for i in range(n)))
        return time.perf_counter() - started, answered, time.thread_time() - cpu
    limits = httpx2.Limits(max_connections=n, max_keepalive_connections=n)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(
        base_url=base, headers=headers, timeout=DEADLINE_S, limits=limits
    ) as http:

        async def ask(i: int) -> None:
            if stream:
                answer = await _streamed(http, body(i))
            else:
                response = await http.post("/responses", json=body(i))
                response.raise_for_status()
                answer = response.json()
            done(i, answer)

        started = time.perf_counter()
        await asyncio.gather(*(ask(i) for i in range(n)))
        return time.perf_counter() - started, answered, time.thread_time() - cpu


async def _raw_post(
    host: str, port: int, path: str, key: str, body: dict[str, Any], stream: bool
) -> dict[str, Any]:
    """One POST on a connection of its own, HTTP/1.1 by hand; the JSON answer (with
    ``stream``, the response its closing event carries)."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port, limit=2**20)
    try:
        writer.write(head + payload)
        status = await reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"the server answered {status!r}: {await reader.read()!r}")
        raw = await reader.read()  # to the close: headers (rest of them) and body
    finally:
        writer.close()
    _, _, content = raw.partition(b"\r\n\r\n")
    if not stream:
        return dict(json.loads(content))
    for line in content.split(b"\n"):
        if line.startswith(b"data: "):
            event = json.loads(line[6:])
            if event["type"] in ("response.completed", "response.failed"):
                return dict(event["response"])
    raise RuntimeError("the stream ended without its closing event")


async def _streamed(client: httpx2.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """A ``stream=true`` response read to its closing event; the response it carries."""
    async with client.stream("POST", "/responses", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                if event["type"] in ("response.completed", "response.failed"):
                    return dict(event["response"])
    raise RuntimeError("the stream ended without its closing event")


def _commit_to_answer(
    url: str, answered: dict[str, float], committed: dict[str, float]
) -> list[float]:
    """Seconds from each run's completing commit (its NOTIFY, as ``Commits`` saw it) to
    its response's answer (as the client saw it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 'resp_' || replace(id::text, '-', ''), run_id::text FROM outbox.responses"
        ).fetchall()
    return [
        answered[rid] - committed[run] for rid, run in rows if rid in answered and run in committed
    ]


# -- a burst past the queue timeout ------------------------------------------------------


def shed(server: str, n: int, log: Path, queue_timeout_s: float) -> dict[str, Any]:
    """N waiting ``responses.create`` at once through the openai SDK with its default
    retries, to a server on ``--queue-timeout queue_timeout_s``: how many were refused
    (``api.shed`` in its log), whether every request got its answer in the end, and that
    no run was made twice (each refusal stored nothing)."""
    inflight.settle_sockets()
    latency = inflight.LatencyServer(MODEL_S, TOOL_S, 1)
    log.write_text("")
    try:
        with bdb.scratch(server, f"clients_shed_{n}") as url:
            key = _api_key(url, latency)
            timeout = ["--queue-timeout", str(queue_timeout_s)]
            with serving(url, latency.url + "/v1", log, 1, *timeout) as (base, _, _relay):
                wall, answers = asyncio.run(_retried_requests(base, key, n))
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*), count(DISTINCT content) FROM outbox.messages"
                    " WHERE role = 'user'"
                ).fetchone()
    finally:
        latency.close()
    assert row is not None
    return {
        "requests": n,
        "queue_timeout_s": queue_timeout_s,
        "wall_s": round(wall, 2),
        "answers": answers,
        "refusals_logged": log.read_text().count('"api.shed"'),
        "runs_started": int(row[0]),
        "runs_started_twice": int(row[0]) - int(row[1]),
    }


async def _retried_requests(base: str, key: str, n: int) -> tuple[float, dict[str, int]]:
    """N ``responses.create`` at once, each retried as the openai SDK does by default
    (twice, after the delay the 503 asks for); the wall and how each ended."""
    from openai import APIStatusError, AsyncOpenAI  # the dev extra's

    sdk = AsyncOpenAI(base_url=base, api_key=key, timeout=DEADLINE_S)

    async def one(i: int) -> str:
        try:
            return str((await sdk.responses.create(model="bench", input=f"run {i}")).status)
        except APIStatusError as err:
            return f"refused {err.status_code}"

    started = time.perf_counter()
    try:
        ended = await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await sdk.close()
    return time.perf_counter() - started, dict(collections.Counter(ended))


# -- the Agents SDK: through outbox serve, and directly -----------------------------------


def agents(server: str, n: int, log: Path) -> dict[str, Any]:
    """The same agent N times at once, against ``outbox serve --with-relay`` and against
    its model directly (see the module's docstring)."""
    ideal = 2 * MODEL_S + TOOL_S
    inflight.settle_sockets()
    latency = inflight.LatencyServer(MODEL_S, TOOL_S, 1)
    try:
        direct, direct_cpu = _agent_runs(latency.url + "/v1", "direct", n)
        stderr(f"  {n} agent runs against the model directly: {direct:.2f} s")
        with bdb.scratch(server, f"clients_agents_{n}") as url:
            key = _api_key(url)
            with serving(url, latency.url + "/v1", log) as (base, process, _relay):
                watch = Connections(url)
                watch.start()
                cpu = inflight.cpu_s(process)
                served, served_cpu = _agent_runs(base, key, n)
                cpu = inflight.cpu_s(process) - cpu
                watch.stop.set()
                watch.join()
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FROM outbox.runs"
                ).fetchone()
                legs = _legs(conn)
        stderr(f"  {n} agent runs against outbox serve --with-relay: {served:.2f} s")
        stderr(
            f"  past the work, p50: the relay's leg {legs['relay_leg_extra_s_p50']:.3f} s,"
            f" the client's {legs['client_leg_extra_s_p50']:.3f} s"
        )
    finally:
        latency.close()
    assert row is not None
    return {
        "runs": n,
        "ideal_s": ideal,
        "direct_wall_s": round(direct, 2),
        "serve_wall_s": round(served, 2),
        "serve_vs_ideal": round(ideal / served, 3),
        "serve_vs_direct": round(served / direct, 2),
        "server_db_connections": watch.server(),
        "db_connections_by_name": watch.most,
        "server_cpu_s": round(cpu, 2),
        "client_cpu_s_direct": round(direct_cpu, 2),
        "client_cpu_s_served": round(served_cpu, 2),
        "server_runs_completed": int(row[0]),
        "server_runs": int(row[1]),
        **legs,
    }


def _legs(conn: psycopg.Connection[Any]) -> dict[str, float]:
    """Where a served run's time went, p50 over the runs from their journals (seconds past
    the work itself): from a response stored to the model turn it asked for recorded, less
    ``MODEL_S`` (the relay's share: claim, dispatch, record), and from the tool call
    intended to its output stored, less ``TOOL_S`` (the client's share: the answer's way
    back, the SDK's turn, its next request and the server storing it)."""
    rows = conn.execute(
        "SELECT run_id, event, at FROM outbox.journal"
        " WHERE event IN ('response.created', 'model_turn.recorded',"
        "                 'tool_call.intended', 'tool_result.stored')"
        " ORDER BY run_id, at, id"
    ).fetchall()
    relay: list[float] = []
    client: list[float] = []
    last: dict[tuple[Any, str], Any] = {}
    for run, event, at in rows:
        if event == "model_turn.recorded" and (run, "response.created") in last:
            relay.append((at - last.pop((run, "response.created"))).total_seconds() - MODEL_S)
        elif event == "tool_result.stored" and (run, "tool_call.intended") in last:
            client.append((at - last.pop((run, "tool_call.intended"))).total_seconds() - TOOL_S)
        else:
            last[(run, event)] = at
    return {
        "relay_leg_extra_s_p50": round(statistics.median(relay), 3) if relay else 0.0,
        "client_leg_extra_s_p50": round(statistics.median(client), 3) if client else 0.0,
    }


def _agent_runs(base_url: str, key: str, n: int) -> tuple[float, float]:
    """The wall of N runs of the agent at once (one event loop, one client), and the CPU
    seconds this process (the SDK and its client) spent on them."""
    from agents import (  # the bench extra's: imported only when this measurement runs
        Agent,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    async def slow(i: int) -> str:
        """Take a while, as a tool does."""
        await asyncio.sleep(TOOL_S)
        return "ok"

    async def go() -> tuple[float, float]:
        # The SDK's own retries (2): a kept-alive connection the server closes as it is
        # reused fails with a read error, and a user's client sends the request again.
        client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=DEADLINE_S)
        model = OpenAIResponsesModel(model="bench", openai_client=client)
        agent = Agent(name="bench", instructions="Use the tool.", tools=[slow], model=model)
        config = RunConfig(tracing_disabled=True)
        try:
            # Once before the clock: the SDK builds its models' schemas on first use, a
            # second of CPU on a slow day that no later run pays.
            await Runner.run(agent, "warm up", run_config=config)
            started, cpu = time.perf_counter(), time.process_time()
            results = await asyncio.gather(
                *(Runner.run(agent, f"run {i}", run_config=config) for i in range(n))
            )
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        finally:
            await client.close()
        if any(r.final_output != "done" for r in results):
            raise RuntimeError("an agent run did not end with the model's answer")
        return wall, cpu

    return asyncio.run(go())


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "waiting"
    n = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else (200 if what == "agents" else 1000)
    log = REPO / "bench" / "results" / f"clients-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    server = db.database_url(start=True)
    stderr(f"load before: {os.getloadavg()}")
    workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 1
    if what == "waiting":
        out = waiting(
            server,
            n,
            log,
            with_writer="--no-writer" not in argv,
            workers=workers,
            stream="--stream" in argv,
            client=argv[argv.index("--client") + 1] if "--client" in argv else "httpx",
        )
    elif what == "shed":
        timeout = argv[argv.index("--queue-timeout") + 1] if "--queue-timeout" in argv else "1"
        out = shed(server, n, log, float(timeout))
    else:
        out = agents(server, n, log)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
