"""The console's render times on a large database: the runs list and a long timeline.

Usage: ``python -m bench.console [--seed-runs 1000000] [--requests 200]`` with
``OUTBOX_DATABASE_URL`` naming a migrated database. ``--seed-runs N`` first inserts N runs
(nine in ten of ``acme``, their threads too) in two statements, with the triggers off
(``session_replication_role``: a superuser's login; nothing else runs on them). It adds a
console user and a run with a 200-event journal, serves the app in this process (uvicorn, real
sockets, a thread) and times whole HTTP requests of a signed-in browser, one at a time:
the first page of the runs list, a filtered page, a page deep in the list by its keyset
cursor, and the 200-event timeline. Prints p50 and p95 in milliseconds per page.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
import uuid

import httpx2
import psycopg
import uvicorn

from outbox import accounts, writer
from outbox.schemas import StartRun
from outbox.server.app import create_app

PASSWORD = "bench password, long enough"
EVENTS = 200


def seed_timeline(url: str) -> uuid.UUID:
    """A run of acme with ``EVENTS`` journal events, and the console user ``bench``."""
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM outbox.console_users WHERE name = 'bench'")
        accounts.add_user(conn, "bench", tenant_id="acme", role="operator", password=PASSWORD)
        thread = writer.create_thread(conn, "acme").id
        run = writer.start_run(
            conn, StartRun(tenant_id="acme", thread_id=thread, model="bench", message="hi")
        )
        for n in range(EVENTS - 1):  # the run's creation is one
            writer.journal(conn, "bench.event", "acme", run_id=run.id, detail={"n": n})
    return run.id


SEED_THREADS = """
INSERT INTO outbox.threads (id, tenant_id, created_at)
SELECT md5(g::text)::uuid, CASE WHEN g %% 10 = 0 THEN 'globex' ELSE 'acme' END,
       now() - g * interval '1 second'
FROM generate_series(1, %(n)s) g
"""
SEED_RUNS = """
INSERT INTO outbox.runs (id, tenant_id, thread_id, model, correlation_id, status, created_at,
                         updated_at)
SELECT md5('r' || g)::uuid, CASE WHEN g %% 10 = 0 THEN 'globex' ELSE 'acme' END,
       md5(g::text)::uuid, CASE WHEN g %% 3 = 0 THEN 'gpt-5' ELSE 'scripted' END, 'c' || g,
       (ARRAY['completed', 'failed', 'cancelled', 'in_progress'])[1 + g %% 4],
       now() - g * interval '1 second', now()
FROM generate_series(1, %(n)s) g
"""


def seed_runs(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no triggers: seeding only
        conn.execute(SEED_THREADS, {"n": n})
        conn.execute(SEED_RUNS, {"n": n})
        conn.execute("ANALYZE outbox.threads, outbox.runs")


def timed(client: httpx2.Client, path: str, requests: int) -> tuple[float, float]:
    spent = []
    for _ in range(requests):
        started = time.perf_counter()
        answer = client.get(path)
        spent.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, (path, answer.status_code)
    quantiles = statistics.quantiles(spent, n=20)
    return statistics.median(spent), quantiles[18]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed-runs", type=int, default=0)
    args = parser.parse_args()
    url = os.environ["OUTBOX_DATABASE_URL"]
    if args.seed_runs:
        seed_runs(url, args.seed_runs)
    run_id = seed_timeline(url)
    with psycopg.connect(url) as conn:
        (runs,) = conn.execute("SELECT count(*) FROM outbox.runs").fetchone() or (0,)
    server = uvicorn.Server(
        uvicorn.Config(create_app(url), port=args.port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)  # until uvicorn listens
    console = f"http://127.0.0.1:{args.port}/console"
    with httpx2.Client(base_url=console, timeout=60) as client:
        form = client.get("/sign-in").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert token is not None
        signed = client.post(
            "/sign-in", data={"name": "bench", "password": PASSWORD, "csrf_token": token[1]}
        )
        assert signed.status_code == 303, signed.status_code
        deep = re.findall(r'href="/console(/runs\?[^"]+)" rel="next"', client.get("/runs").text)
        pages = {
            "runs list, first page": "/runs",
            "runs list, status=completed": "/runs?status=completed",
            "runs list, second page (keyset)": deep[0].replace("&amp;", "&"),
            f"timeline of {EVENTS} events": f"/runs/{run_id}",
        }
        print(f"{runs:,} runs in the database; {args.requests} requests a page, one at a time")
        for name, path in pages.items():
            timed(client, path, 5)  # warm
            p50, p95 = timed(client, path, args.requests)
            print(f"{name:34} p50 {p50:6.1f} ms   p95 {p95:6.1f} ms")
    server.should_exit = True
    thread.join(timeout=10)


if __name__ == "__main__":
    main()
