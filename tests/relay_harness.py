"""Shared pieces for relay tests: seed intents, run relays (threads or processes), wait."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from outbox import registry, writer
from outbox.relay.config import RelayConfig
from outbox.relay.worker import Worker
from outbox.testing.relay import FAST_ARGS, wait_until
from outbox.testing.tools import FakeToolService
from tests import forked
from tests.helpers import TENANT, look, new_run, turn

REPO = Path(__file__).resolve().parent.parent
FAST = list(FAST_ARGS)  # short leases and sweeps, so crashes are rescued in about 2 s


def scalar(db_url: str, query: str, params: Any = None) -> Any:
    rows = look(db_url, query, params)
    return rows[0][0] if rows else None


def register_tool(
    conn: psycopg.Connection[Any], service: FakeToolService, name: str, mode: str, **kw: Any
) -> None:
    spec: dict[str, Any] = {
        "name": name,
        "executor": "http",
        "endpoint": service.endpoint(name),
        "idempotency_mode": mode,
        "timeout_s": 2.0,
        # How long after its timeout an abandoned request may still act at the fake tools:
        # they act at once (or when a test's fault says), so tests need not wait 5 s.
        "settle_s": 0.5,
        "max_attempts": 8,
    }
    if mode == "lookup":
        spec["lookup_endpoint"] = service.lookup_endpoint(name)
    spec.update(kw)
    registry.register(conn, registry.ToolSpec(**spec))


def seed(
    db_url: str, tools: list[str], runs: int, calls_per_batch: int, args: Callable[[int], Any]
) -> list[int]:
    """``runs`` runs, each with one batch of ``calls_per_batch`` calls cycling over ``tools``."""
    refs: list[int] = []
    n = 0
    with psycopg.connect(db_url) as conn:
        for _ in range(runs):
            run = new_run(conn, tools=sorted(set(tools)))
            calls = []
            for position in range(calls_per_batch):
                calls.append((f"call_{position}", tools[n % len(tools)], args(n)))
                n += 1
            refs += writer.record_model_turn(conn, turn(run, 1, *calls)).tool_call_refs
            conn.commit()
    return refs


def config(db_url: str, **overrides: Any) -> RelayConfig:
    values: dict[str, Any] = {
        "database_url": db_url,
        "concurrency": 8,
        "tenant_share": 1.0,  # tests count exact claims; the cap has its own (test_limits)
        "lease_s": 5.0,
        "poll_interval_s": 0.2,
        "rescue_interval_s": 0.3,
        "stalled_batch_grace_s": 0.5,
        "retry_base_s": 0.05,
        "retry_cap_s": 0.5,
        "grace_s": 5.0,
        "kinds": ("tool_call", "deliver_batch"),
    }
    values.update(overrides)
    return RelayConfig(**values)


@contextmanager
def relay_thread(db_url: str, **overrides: Any) -> Iterator[Worker]:
    worker = Worker(config(db_url, **overrides))
    thread = threading.Thread(target=worker.run, name="relay-under-test")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "relay thread did not stop"


def start_relay_process(
    db_url: str, log_path: Path, *args: str, env: dict[str, str] | None = None
) -> forked.Forked:
    """A relay process (forked: ``tests/forked.py``); without ``--kind`` arguments it runs
    tool calls and deliveries."""
    kinds = [] if "--kind" in args else ["--kind", "tool_call", "--kind", "deliver_batch"]
    level = [] if "--log-level" in args else ["--log-level", "WARNING"]
    process_env = {**os.environ, **(env or {}), "OUTBOX_DATABASE_URL": db_url}
    return forked.start(["relay", *kinds, *level, *args], process_env, REPO, log_path)


def tool_call_states(db_url: str) -> dict[str, int]:
    rows = look(db_url, "SELECT status, count(*) FROM outbox.tool_calls GROUP BY 1")
    return {status: n for status, n in rows}


def all_settled(db_url: str) -> bool:
    """No tool call or delivery left to do (terminal or parked for an operator)."""
    left = scalar(
        db_url,
        "SELECT count(*) FROM outbox.outbox WHERE kind IN ('tool_call', 'deliver_batch') "
        "AND status <> 'quarantined'",
    )
    return left == 0


__all__ = ["TENANT", "wait_until"]
