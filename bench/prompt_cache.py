"""The provider's prompt cache over a long run (``python -m bench.prompt_cache [TURNS]``).

One run of TURNS model turns (a tool call each, then an answer) through an in-process
relay against the scripted model (``outbox.testing.scripted_model``), whose prefix cache reports
as cached the bytes a request shares from the start with the last request under its
``prompt_cache_key``, at 4 bytes a token: the same run twice, once on a model that keeps
the cache (every request carries the thread's key) and once on one that caches nothing
(what a run without the key gets). It prints, per turn, the input and cached tokens
recorded, the share of turns 2..n's input read from the cache, and the run's cost priced
at $2 per million input tokens, $0.20 per million cached and $8 per million output: the
prices are an example, the ratio is the point. A scratch database on the embedded server.
"""

from __future__ import annotations

import argparse
import sys
import threading
from decimal import Decimal

import psycopg

from bench import db as bench_db
from outbox import budgets, db, registry, writer
from outbox.relay.config import RelayConfig
from outbox.relay.worker import Worker
from outbox.schemas import StartRun
from outbox.testing.relay import wait_until
from outbox.testing.scripted_model import ScriptedModel
from outbox.testing.tools import FakeToolService

TENANT = "bench"
PRICES = {"input_per_mtok": "2", "cached_input_per_mtok": "0.2", "output_per_mtok": "8"}


def one_run(url: str, turns: int, *, cache: bool) -> list[tuple[int, int, int, Decimal]]:
    """(input, cached, output tokens, cost) of each turn of one run of ``turns`` turns."""
    mails = [
        {"tool_calls": [{"name": "send_email", "arguments": {"to": f"{n}@b.c", "subject": "x"}}]}
        for n in range(turns - 1)
    ]
    with ScriptedModel({"long": [*mails, {"text": "all sent"}]}, prefix_cache=cache) as model:
        with psycopg.connect(url) as conn:
            thread = writer.create_thread(conn, TENANT).id
            run = writer.start_run(
                conn,
                StartRun(
                    tenant_id=TENANT,
                    thread_id=thread,
                    model="scripted-1",
                    base_url=model.url + "/v1",
                    message="script:long mail everyone on the list",
                    tools=["send_email"],
                    instructions="You send mail for the order desk. " * 40,
                    max_steps=turns + 1,
                ),
            )
            conn.commit()
        worker = Worker(RelayConfig(database_url=url, poll_interval_s=0.05))
        relay = threading.Thread(target=worker.run, name="bench-relay")
        relay.start()
        try:
            wait_until(
                lambda: (
                    bench_db.scalar(url, "SELECT status FROM outbox.runs WHERE id = %s", [run.id])
                    in ("completed", "failed")
                ),
                timeout_s=300,
                what="the run's end",
            )
        finally:
            worker.stop()
            relay.join()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT input_tokens, cached_tokens, output_tokens, cost FROM outbox.model_turns "
            "WHERE run_id = %s ORDER BY step_no",
            [run.id],
        ).fetchall()
    return [(int(i), int(c), int(o), Decimal(cost)) for i, c, o, cost in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prompt_cache", description=__doc__)
    parser.add_argument("turns", type=int, nargs="?", default=20, help="model turns (20)")
    args = parser.parse_args(argv)
    server = db.database_url(start=True)
    with bench_db.scratch(server, "prompt_cache") as url, FakeToolService() as tools:
        with psycopg.connect(url) as conn:
            budgets.set_price(conn, "scripted-1", **PRICES)
            registry.register(
                conn,
                registry.ToolSpec(
                    name="send_email",
                    executor="http",
                    endpoint=tools.endpoint("send_email"),
                    idempotency_mode="key",
                ),
            )
            conn.commit()
        kept = one_run(url, args.turns, cache=True)
        none = one_run(url, args.turns, cache=False)
    print(f"{'turn':>4} {'input':>7} {'cached':>7} {'cached %':>8}")
    for n, (inp, cached, _, _) in enumerate(kept, 1):
        print(f"{n:>4} {inp:>7} {cached:>7} {100 * cached / max(inp, 1):>7.1f}%")
    later_in = sum(r[0] for r in kept[1:])
    later_cached = sum(r[1] for r in kept[1:])
    print(
        f"turns 2..{len(kept)}: {later_cached} of {later_in} input tokens cached "
        f"({100 * later_cached / max(later_in, 1):.1f}%)"
    )
    with_key, without = sum(r[3] for r in kept), sum(r[3] for r in none)
    print(
        f"run cost with the cache key: ${with_key:.6f}; without: ${without:.6f} "
        f"({without / with_key:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
