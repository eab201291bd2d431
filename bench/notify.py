"""What NOTIFY costs writers: commits/s of concurrent backends with the trigger on and off.

A transaction that issued ``NOTIFY`` takes a database-wide lock at commit, so concurrent
committers queue on it. Each writer thread commits whole user turns (``create_thread``,
``start_run`` and a ``record_model_turn`` with one tool call: several outbox rows, so one
folded notification per transaction) as fast as it can; ``SET outbox.notify = 'off'``
switches the trigger off for the session.
"""

from __future__ import annotations

import threading
import time

import psycopg

from bench import seed
from outbox import writer


def commits_per_s(url: str, tool: str, threads: int, per_thread: int, notify: bool) -> float:
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def writer_thread() -> None:
        try:
            with psycopg.connect(url) as conn:
                if not notify:
                    conn.execute("SET outbox.notify = 'off'")
                    conn.commit()
                barrier.wait()
                for i in range(per_thread):
                    run = seed.start_run(conn, tool)
                    writer.record_model_turn(conn, seed.turn(run, tool, i, 1))
                    conn.commit()
        except BaseException as err:  # reported after the join
            errors.append(err)
            barrier.abort()

    workers = [threading.Thread(target=writer_thread) for _ in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return threads * per_thread / elapsed
