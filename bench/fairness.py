"""Fairness: how long one call of a second tenant waits behind another tenant's backlog.

``BACKLOG`` calls of tenant ``bench`` (the HTTP tool ``slow`` of ``bench.latency_server``,
answering after ``T`` seconds) are queued and one relay process is started at its defaults.
Once a quarter of the backlog is done (the relay's clients and connections are warm), one
call of tenant ``other`` is queued; its wait is its
row's ``claimed_at - available_at``, both from the database's clock. Claimed oldest first,
that call would wait for the whole backlog ahead of it to be
claimed: about ``BACKLOG / concurrency x T``. The fair claim takes it in the next claim.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import db as bdb
from bench import seed
from bench.inflight import TOOL, LatencyServer
from bench.throughput import REPO, stderr
from outbox import writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

OTHER = "other"
POLL_S = 0.002  # how often the newcomer's row is looked at


def measure(server: str, backlog: int, tool_s: float, log_path: Path) -> dict[str, Any]:
    latency = LatencyServer(0.0, tool_s, 1)
    try:
        with bdb.scratch(server, "fairness") as url:
            seed.register_http_tool(url, TOOL, latency.url + "/tools/" + TOOL, timeout_s=60)
            seed.seed_calls(url, TOOL, backlog, progress=seed.progress_printer("backlog", backlog))
            with bdb.admin(url) as conn:
                conn.execute("DELETE FROM outbox.outbox WHERE kind = 'model_turn'")
                conn.execute("VACUUM ANALYZE")
            env = {**os.environ, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(REPO)}
            command = [sys.executable, "-m", "outbox.commands", "relay", "--log-level", "WARNING"]
            command += ["--kind", "tool_call", "--kind", "deliver_batch"]
            with open(log_path, "ab") as log:
                relay = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
            try:
                return _newcomer_wait(url, relay, backlog, tool_s)
            finally:
                relay.terminate()
                relay.wait(timeout=60)
    finally:
        latency.close()


def _newcomer_wait(
    url: str, relay: subprocess.Popen[bytes], backlog: int, tool_s: float
) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 120
        while conn.execute("SELECT count(*) FROM outbox.tool_results").fetchone()[0] < (  # type: ignore[index]
            backlog // 4
        ):
            if relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the relay did not drain a quarter of the backlog")
            time.sleep(0.01)
        ahead = _queue_newcomer(url)
        deadline = time.monotonic() + 120
        while True:
            row = conn.execute(
                "SELECT extract(epoch FROM claimed_at - available_at)::float8 "
                "FROM outbox.outbox WHERE tenant_id = %s AND kind = 'tool_call' "
                "AND status = 'leased'",
                (OTHER,),
            ).fetchone()
            if row is not None:
                break
            if relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the newcomer's call was not claimed")
            time.sleep(POLL_S)  # polling a condition with a deadline
    return {
        "backlog": backlog,
        "tool_s": tool_s,
        "ready_ahead": ahead,
        "wait_ms": round(1000 * row[0], 1),
    }


def _queue_newcomer(url: str) -> int:
    """One call of another tenant; returns how many ready rows were ahead of it."""
    with psycopg.connect(url) as conn:
        thread = writer.create_thread(conn, OTHER)
        run = writer.start_run(
            conn, StartRun(tenant_id=OTHER, thread_id=thread.id, model="bench", tools=[TOOL])
        )
        call = ToolCallIn(tool_call_id="call_0", name=TOOL, arguments={"n": 0})
        writer.record_model_turn(
            conn, ModelTurnIn(tenant_id=OTHER, run_id=run.id, step_no=1, tool_calls=[call])
        )
        ahead = conn.execute(
            "SELECT count(*) FROM outbox.outbox WHERE status = 'ready' AND kind = 'tool_call'"
        ).fetchone()
        conn.commit()
    return int(ahead[0]) if ahead else 0


def run(server: str, backlog: int, tool_s: float, log: Path) -> dict[str, Any]:
    stderr(f"fairness: {backlog:,} calls of one tenant queued, then one of another")
    figures = measure(server, backlog, tool_s, log)
    stderr(
        f"  the newcomer waited {figures['wait_ms']} ms with {figures['ready_ahead']:,} "
        "older calls of the other tenant ready"
    )
    return figures
