"""Requests waiting on a run: from the run's last commit to the answer, polled or woken.

A waiting ``responses.create`` (no ``background``) answers once its run settles: one
``LISTEN outbox_runs`` connection per server process wakes it (``outbox.server.wakeups``).
``listen=False`` is the fallback for poolers: it polls the run, a pause growing from 50 ms
to 1 s, through the thread pool.

Two measures, each with ``listen`` on and off, on one scratch database:

- **one at a time**: ``requests`` times, a waiting ``responses.create`` whose run the bench
  cancels (the run's last commit) once it was waited on a while (the wait
  ``SETTLE_S``: so the poll has grown, as for a model turn of seconds); the time from that
  commit to the answer, p50 and p99.
- **all at once**: ``AT_ONCE`` (default ``requests``) waiting requests together, their
  runs cancelled in one transaction; the wall time from that commit until the last one answered.

No relay and no model: the run's end is a commit made here, so only the waiting is
measured. ``python -m bench.waiting [REQUESTS [AT_ONCE]]`` runs it alone on the embedded server.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx2
import psycopg

from bench import db as bdb
from bench.serve import _serving
from bench.throughput import stderr
from outbox import db, keys, lifecycle

TENANT = "bench"
SETTLE_S = 3.0  # how long a request waits before its run ends (a model turn of seconds)
DEADLINE_S = 60.0  # seconds any one wait may take before the bench gives up


def measure(server: str, requests: int, together: int) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": requests, "together": together}
    for listen in (False, True):
        with bdb.scratch(server, f"waiting_{'listen' if listen else 'poll'}") as url:
            with psycopg.connect(url) as conn:
                _, key = keys.create_key(conn, TENANT, name="bench")
                conn.commit()
            with _serving(url, listen=listen) as base:
                headers = {"Authorization": f"Bearer {key}"}
                with httpx2.Client(base_url=base, headers=headers, timeout=DEADLINE_S) as c:
                    name = "listen" if listen else "poll"
                    out[f"{name}_one"] = _one_at_a_time(url, c, requests)
                    out[f"{name}_all_s"] = _all_at_once(url, c, together)
    return out


def _ask(client: httpx2.Client, n: int) -> float:
    """A waiting responses.create; returns when it answered (perf_counter)."""
    body = {"model": "bench-model", "input": f"hello {n}"}
    client.post("/responses", json=body).raise_for_status()
    return time.perf_counter()


def _runs_waited_on(url: str, known: set[uuid.UUID], count: int) -> list[uuid.UUID]:
    deadline = time.monotonic() + DEADLINE_S
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            rows = conn.execute("SELECT run_id FROM outbox.responses").fetchall()
            new = [uuid.UUID(str(r[0])) for r in rows if uuid.UUID(str(r[0])) not in known]
            if len(new) >= count:
                return new
            time.sleep(0.005)  # polling a condition with a deadline
    raise RuntimeError("the waiting requests did not start their runs")


def _end(url: str, runs: list[uuid.UUID]) -> float:
    """Cancel ``runs`` in one transaction; returns when it committed (perf_counter)."""
    with psycopg.connect(url) as conn:
        for run_id in runs:
            lifecycle.cancel_run(conn, run_id, TENANT, actor="bench")
        conn.commit()
    return time.perf_counter()


def _one_at_a_time(url: str, client: httpx2.Client, requests: int) -> dict[str, float]:
    samples, known = [], set[uuid.UUID]()
    with ThreadPoolExecutor(1) as pool:
        for n in range(requests):
            answered: Future[float] = pool.submit(_ask, client, n)
            runs = _runs_waited_on(url, known, 1)
            known.update(runs)
            time.sleep(SETTLE_S)  # the model turn this stands for
            committed = _end(url, runs)
            samples.append(answered.result(timeout=DEADLINE_S) - committed)
    ordered = sorted(samples)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def _all_at_once(url: str, client: httpx2.Client, requests: int) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        known = {uuid.UUID(str(r[0])) for r in conn.execute("SELECT id FROM outbox.runs")}
    with ThreadPoolExecutor(requests) as pool:
        answers = [pool.submit(_ask, client, n) for n in range(requests)]
        runs = _runs_waited_on(url, known, requests)
        time.sleep(SETTLE_S)
        committed = _end(url, runs)
        last = max(a.result(timeout=DEADLINE_S) for a in answers)
    return last - committed


def run(server: str, requests: int, together: int) -> dict[str, Any]:
    stderr(f"requests waiting on a run, polled and woken by LISTEN: {requests} each")
    out = measure(server, requests, together)
    for name in ("poll", "listen"):
        one = out[f"{name}_one"]
        stderr(
            f"  {name}: commit to answer p50 {one['p50_ms']:.1f} ms, p99 {one['p99_ms']:.1f} ms;"
            f" {together} at once: {1000 * out[f'{name}_all_s']:.0f} ms"
        )
    return out


def main(argv: list[str]) -> int:
    requests = int(argv[0]) if argv else 20
    together = int(argv[1]) if len(argv) > 1 else requests
    out = run(db.database_url(start=True), requests, together)
    for name in ("poll", "listen"):
        one = out[f"{name}_one"]
        print(
            f"{name:<7} commit to answer p50 {one['p50_ms']:7.1f} ms  p99 {one['p99_ms']:7.1f} ms"
            f"  {together} at once: last answer {1000 * out[f'{name}_all_s']:7.1f} ms after"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
