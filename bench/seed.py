"""Seed tool-call intents with the writer API, as a backend would write them.

``record_model_turn`` with the largest batch a turn may hold (``MAX_TOOL_CALLS_PER_TURN``)
writes, per call, the intent, its journal event and its outbox row, all in the caller's
transaction. Several turns share one transaction and the NOTIFY trigger is off while
seeding (nobody listens yet), so seeding is bounded by the writer's statements, not by
commits. What lands in the tables is exactly what the writer produces, with nothing
set-based to keep in sync with it.
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, wait
from typing import Any

import psycopg

from outbox import config, registry, writer
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn

TENANT = "bench"
TURNS_PER_COMMIT = 8


def register_python_tool(url: str, name: str, callable_path: str, **kw: Any) -> None:
    with psycopg.connect(url) as conn:
        spec = {"name": name, "executor": "python", "callable": callable_path, **kw}
        registry.register(conn, registry.ToolSpec(**spec))


def register_http_tool(url: str, name: str, endpoint: str, **kw: Any) -> None:
    with psycopg.connect(url) as conn:
        spec = {"name": name, "executor": "http", "endpoint": endpoint, **kw}
        registry.register(conn, registry.ToolSpec(**spec))


def start_run(conn: psycopg.Connection[Any], tool: str) -> writer.RunRef:
    thread = writer.create_thread(conn, TENANT)
    return writer.start_run(
        conn,
        StartRun(tenant_id=TENANT, thread_id=thread.id, model="bench", tools=[tool]),
    )


def turn(run: writer.RunRef, tool: str, first: int, n: int) -> ModelTurnIn:
    calls = [
        ToolCallIn(tool_call_id=f"call_{i}", name=tool, arguments={"n": first + i})
        for i in range(n)
    ]
    return ModelTurnIn(tenant_id=TENANT, run_id=run.id, step_no=1, tool_calls=calls, input_tokens=1)


def seed_calls(
    url: str,
    tool: str,
    calls: int,
    *,
    per_turn: int | None = None,
    processes: int = 1,
    progress: Callable[[int], None] | None = None,
) -> None:
    """``calls`` intents of ``tool`` in turns of ``per_turn``, by ``processes`` writers."""
    per_turn = per_turn or config.MAX_TOOL_CALLS_PER_TURN
    if processes <= 1:
        _seed_part(url, tool, 0, calls, per_turn, progress)
        return
    share = -(-calls // processes)
    parts = [(i * share, min(share, calls - i * share)) for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        counter = manager.Value("i", 0)
        lock = manager.Lock()
        with ProcessPoolExecutor(processes, mp_context=context) as pool:
            futures = [
                pool.submit(_seed_shared, url, tool, first, n, per_turn, counter, lock)
                for first, n in parts
                if n > 0
            ]
            while not all(f.done() for f in futures):
                wait(futures, timeout=0.5)
                if progress is not None:
                    progress(counter.value)
            for future in futures:
                future.result()
    if progress is not None:
        progress(calls)


def _seed_shared(
    url: str, tool: str, first: int, calls: int, per_turn: int, counter: Any, lock: Any
) -> None:
    def count(n: int) -> None:
        with lock:
            counter.value += n

    _seed_part(url, tool, first, calls, per_turn, count, delta=True)


def _seed_part(
    url: str,
    tool: str,
    first: int,
    calls: int,
    per_turn: int,
    progress: Callable[[int], None] | None,
    delta: bool = False,
) -> None:
    done = 0
    with psycopg.connect(url) as conn:
        conn.execute("SET outbox.notify = 'off'")
        while done < calls:
            for _ in range(TURNS_PER_COMMIT):
                n = min(per_turn, calls - done)
                if n <= 0:
                    break
                run = start_run(conn, tool)
                writer.record_model_turn(conn, turn(run, tool, first + done, n))
                done += n
                if delta and progress is not None:
                    progress(n)
            conn.commit()
            if not delta and progress is not None:
                progress(done)


def progress_printer(label: str, total: int) -> Callable[[int], None]:
    started = time.monotonic()
    last = [0.0]
    finished = [False]

    def show(done: int) -> None:
        now = time.monotonic()
        if finished[0]:
            return
        if now - last[0] >= 1.0 or done >= total:
            last[0] = now
            finished[0] = done >= total
            rate = done / max(now - started, 1e-9)
            print(f"\r  {label}: {done}/{total} ({rate:,.0f}/s)", end="", file=sys.stderr)
            if done >= total:
                print(file=sys.stderr)

    return show
