"""``python -m bench.citus URL``: distribute a migrated schema over a Citus cluster by tenant,
and report what Citus refuses.

URL names the coordinator's database, migrated with ``outbox db upgrade``, where
``CREATE EXTENSION citus`` ran and the workers were added (docs/scale.md, "What was run on
Citus", has the commands that build and start such a cluster). The foreign keys are taken
off (two of them close a circle, messages and tool_calls, which no order of distribution
passes), every table is made a reference table (``REFERENCE_TABLES``: copied to every node)
or is distributed by ``tenant_id``, co-located with the others, and each foreign key is put
back; each in a transaction of its own, so one refusal does not hide the next.

``--unsafe-triggers`` sets ``citus.enable_unsafe_triggers`` for the session (Citus refuses to
distribute a table with triggers without it); ``--direct-policies`` first rewrites the
row-level security policies to call ``current_tenant_v1()`` directly rather than through a
subquery (Citus refuses subqueries in the policies of its tables). Then the claim is tried
across tenants and for one tenant. ``--exercise`` then walks one run through the writer API
and the relay's statements (``exercise``). Prints a line per table, foreign key, probe and
step, with the error of each refusal; ``--json PATH`` writes them too.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import psycopg

from bench import seed
from outbox import tenancy, writer
from outbox.relay.config import RelayConfig
from outbox.relay.worker import Worker
from outbox.schemas import ModelTurnIn, StartRun, ToolCallIn, ToolResultIn

SCHEMA = "outbox"

# The tables copied to every node. Those without tenant_id are the platform's settings and
# caches; the others are read before a tenant is known (a login, an API key, a console
# sign-in) or hold rows every tenant reads (tenant '*': shared tools, MCP servers, risk
# rules, switches, credentials, retention defaults), which a statement of one tenant must
# find on its own node. Each is small and written rarely: a write to one is a transaction
# on every node.
REFERENCE_TABLES: dict[str, str] = {
    "alembic_version": "the schema's revision",
    "lanes": "the claims' concurrency lanes, tool-scoped ones across tenants",
    "model_catalogue": "the models' context windows",
    "model_circuits": "the circuit of each model endpoint",
    "model_fallbacks": "the fallback of each model",
    "model_prices": "the price of each model",
    "platform_limits": "the platform's one row of limits",
    "run_defaults": "the platform's one row of run defaults",
    "api_keys": "read by key hash before the tenant is known",
    "tenant_roles": "read by login role before the tenant is known",
    "console_users": "read by name at sign-in, before the tenant is known",
    "console_sessions": "read by cookie before the tenant is known",
    "tools": "shared tools (tenant '*') beside each tenant's own",
    "mcp_servers": "shared MCP servers (tenant '*')",
    "risk_policies": "shared risk rules (tenant '*')",
    "tool_switches": "switches of every tenant (tenant '*')",
    "credentials": "shared credentials (tenant '*')",
    "retention_policies": "the default retention (tenant '*')",
}

TABLES = """
SELECT c.relname, EXISTS (SELECT 1 FROM pg_attribute a
                          WHERE a.attrelid = c.oid AND a.attname = 'tenant_id'
                            AND NOT a.attisdropped)
FROM pg_class c
WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
ORDER BY c.relname
"""
FOREIGN_KEYS = """
SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
FROM pg_constraint c
WHERE c.contype = 'f' AND c.connamespace = %(s)s::regnamespace AND c.conparentid = 0
ORDER BY 1, 2
"""
POLICIES = """
SELECT p.polname, p.polrelid::regclass::text, pg_get_expr(p.polqual, p.polrelid),
       pg_get_expr(p.polwithcheck, p.polrelid)
FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace = %(s)s::regnamespace
"""
# The policies' subquery: one call a statement instead of one a row, on one server.
SUBQUERY = re.compile(r"\( SELECT (\w+)\.current_tenant_v1\(\) AS current_tenant_v1\)")
DIRECT = r"\1.current_tenant_v1()"
# A claim of the relay's form: ready rows in order, locked, skipping the locked ones.
CLAIM = """
SELECT o.id FROM {s}.outbox o
WHERE o.status = 'ready' AND o.available_at <= now() {tenant}
ORDER BY o.available_at, o.id LIMIT 10 FOR UPDATE SKIP LOCKED
"""


def kinds(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """How each table is to be made: ``reference`` or ``distributed``."""
    return {
        name: "reference" if name in REFERENCE_TABLES or not tenant else "distributed"
        for name, tenant in conn.execute(TABLES, {"s": SCHEMA}).fetchall()
    }


def attempt(conn: psycopg.Connection[Any], statement: str) -> str | None:
    """Run ``statement`` in a transaction of its own; the first line of its error, if any."""
    try:
        with conn.transaction():
            conn.execute(statement)
    except psycopg.Error as error:
        return " ".join(str(error).split())
    return None


def direct_policies(conn: psycopg.Connection[Any]) -> int:
    """Rewrite the policies that call current_tenant_v1() through a subquery to call it
    directly; how many were rewritten."""
    rewritten = 0
    for name, table, using, check in conn.execute(POLICIES, {"s": SCHEMA}).fetchall():
        clauses = []
        if using and SUBQUERY.search(using):
            clauses.append(f"USING ({SUBQUERY.sub(DIRECT, using)})")
        if check and SUBQUERY.search(check):
            clauses.append(f"WITH CHECK ({SUBQUERY.sub(DIRECT, check)})")
        if clauses:
            conn.execute(f"ALTER POLICY {name} ON {table} {' '.join(clauses)}")
            rewritten += 1
    return rewritten


def distribute(url: str, unsafe_triggers: bool, policies: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        if unsafe_triggers:
            conn.execute("SET citus.enable_unsafe_triggers = on")
        if policies:
            rows.append(
                {
                    "table": "*",
                    "as": "policies rewritten",
                    "refused": None,
                    "count": direct_policies(conn),
                }
            )
        keys = conn.execute(FOREIGN_KEYS, {"s": SCHEMA}).fetchall()
        for table, name, _ in keys:
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        # Reference tables first, so a distributed table's first shard placement is settled
        # before anything co-locates with it.
        colocate = "default"
        made = sorted(kinds(conn).items(), key=lambda t: (t[1] != "reference", t[0]))
        for name, kind in made:
            table = f"{SCHEMA}.{name}"
            if kind == "reference":
                statement = f"SELECT create_reference_table('{table}')"
            else:
                statement = (
                    f"SELECT create_distributed_table('{table}', 'tenant_id', "
                    f"colocate_with => '{colocate}')"
                )
            refused = attempt(conn, statement)
            if kind == "distributed" and colocate == "default" and refused is None:
                colocate = table
            rows.append({"table": name, "as": kind, "refused": refused})
        for table, name, definition in keys:
            refused = attempt(conn, f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            rows.append({"table": table.removeprefix(f"{SCHEMA}."), "as": name, "refused": refused})
    return rows


def probe(url: str) -> list[dict[str, Any]]:
    """The claim across tenants and for one tenant."""
    rows: list[dict[str, Any]] = []
    forms = {"claim across tenants": "", "claim of one tenant": "AND o.tenant_id = 'tenant-a'"}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, tenant in forms.items():
            refused = attempt(conn, CLAIM.format(s=SCHEMA, tenant=tenant))
            rows.append({"probe": name, "refused": refused})
    return rows


def exercise(url: str) -> list[dict[str, Any]]:
    """One run of tenant-a, step by step as a backend and a relay write it, and the reads
    of a tenant's role under row-level security; each step in a transaction of its own."""
    rows: list[dict[str, Any]] = []
    made: dict[str, Any] = {}

    def step(name: str, body: Any) -> None:
        try:
            with psycopg.connect(url) as conn:
                body(conn)
                conn.commit()
        except Exception as error:  # every refusal is a finding: report it and go on
            rows.append({"step": name, "refused": " ".join(str(error).split())[:300]})
            return
        rows.append({"step": name, "refused": None})

    def start(conn: psycopg.Connection[Any]) -> None:
        thread = writer.create_thread(conn, "tenant-a")
        made["run"] = writer.start_run(
            conn,
            StartRun(tenant_id="tenant-a", thread_id=thread.id, model="m", tools=["echo"]),
        )

    def model_turn(conn: psycopg.Connection[Any]) -> None:
        call = ToolCallIn(tool_call_id="call_1", name="echo", arguments={"n": 1})
        turn = ModelTurnIn(
            tenant_id="tenant-a", run_id=made["run"].id, step_no=1, tool_calls=[call]
        )
        made["call"] = writer.record_model_turn(conn, turn).tool_call_refs[0]

    def relay_claim(conn: psycopg.Connection[Any]) -> None:
        worker = Worker(RelayConfig(database_url=url))
        link = worker.claim_link()
        try:
            worker._claim(link, 10, ["tool_call"])
        finally:
            link.close()

    def result(conn: psycopg.Connection[Any]) -> None:
        writer.record_tool_result(
            conn,
            ToolResultIn(tenant_id="tenant-a", tool_call_ref=made["call"], status="ok", output={}),
        )

    def scoped_read(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SET LOCAL ROLE outbox_writer")
        tenancy.scope(conn, "tenant-a")
        seen = conn.execute(f"SELECT count(*) FROM {SCHEMA}.runs").fetchone()
        if not seen or seen[0] == 0:
            raise RuntimeError("tenant-a's role sees none of its runs")

    step(
        "register a tool (reference table)",
        lambda conn: seed.register_python_tool(url, "echo", "bench.tools:noop"),
    )
    step("create_thread + start_run", start)
    step("record_model_turn with a call", model_turn)
    step("the relay's claim", relay_claim)
    step("record_tool_result", result)
    step("a tenant's role reads its runs (RLS)", scoped_read)
    step(
        "the operators' view stuck_runs",
        lambda conn: conn.execute(f"SELECT * FROM {SCHEMA}.stuck_runs").fetchall(),
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.citus", description=__doc__)
    parser.add_argument("url", help="the coordinator's database, migrated, with citus")
    parser.add_argument("--unsafe-triggers", action="store_true")
    parser.add_argument("--direct-policies", action="store_true")
    parser.add_argument("--exercise", action="store_true")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    tables = distribute(args.url, args.unsafe_triggers, args.direct_policies)
    probes = probe(args.url)
    steps = exercise(args.url) if args.exercise else []
    for row in tables:
        print(f"{row['table']:<22} {row['as']:<12} {row['refused'] or 'ok'}")
    for row in probes:
        print(f"{row['probe']:<35} {row['refused'] or 'ok'}")
    for row in steps:
        print(f"{row['step']:<40} {row['refused'] or 'ok'}")
    refused = sum(1 for row in tables if row["refused"])
    print(
        f"{len(tables) - refused} of {len(tables)} tables and foreign keys made; {refused} refused"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"tables": tables, "probes": probes, "steps": steps}, out, indent=2)


if __name__ == "__main__":
    main()
