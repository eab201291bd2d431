"""``python -m bench.claim_cost [SERVER_URL] [RELAY_SQL]``: what one claim costs on a backlog.

A scratch database holds 10,000 ready calls of one tenant (written by the writer API, as
``bench.seed`` does) and one call of another; a relay's claim link (generic plans,
``enable_seqscan = off``, JIT off) then claims 1,000, 1,000, 32, 32 and 1,000 rows, and each
claim's wall time is printed with the tenants it took. ``RELAY_SQL`` runs the ``claim`` of
another copy of ``relay/queries/relay.sql`` (an older claim, to compare on the same data).
Without ``SERVER_URL``, the embedded server.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psycopg

from bench import db as bdb
from bench import seed
from outbox import db, writer
from outbox.relay.config import RelayConfig
from outbox.relay.worker import Worker
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn
from outbox.sql import Queries

BACKLOG = 10_000
CLAIMS = (1000, 1000, 32, 32, 1000)


def main(argv: list[str]) -> int:
    server = argv[0] if argv else db.EmbeddedServer.default().start()
    with bdb.scratch(server, "claim_cost") as url:
        seed.register_python_tool(url, "echo", "bench.tools:noop")
        seed.seed_calls(url, "echo", BACKLOG)
        with psycopg.connect(url) as conn:
            thread = writer.create_thread(conn, "other")
            run = writer.start_run(
                conn, StartRun(tenant_id="other", thread_id=thread.id, model="m", tools=["echo"])
            )
            call = ToolCallIn(tool_call_id="c", name="echo", arguments={"n": 1})
            writer.record_model_turn(
                conn, ModelTurnIn(tenant_id="other", run_id=run.id, step_no=1, tool_calls=[call])
            )
            conn.commit()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        worker = Worker(RelayConfig(database_url=url))
        if len(argv) > 1:
            worker.q = Queries(Path(argv[1]), "outbox")
        link = worker.claim_link()
        try:
            for limit in CLAIMS:
                started = time.perf_counter()
                rows = worker._claim(link, limit, ["tool_call"])
                ms = 1000 * (time.perf_counter() - started)
                tenants = sorted({r.tenant_id for r in rows})
                print(f"claim of {limit}: {len(rows)} rows in {ms:.1f} ms, tenants {tenants}")
        finally:
            link.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
