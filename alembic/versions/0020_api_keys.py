"""API keys per tenant, the assistants and run links of the Assistants protocol, the role
``outbox_api`` that ``outbox serve`` acts as.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-24

``api_keys`` maps the SHA-256 of a key to its tenant (revocable); ``assistants`` and
``assistant_runs`` keep what the Assistants protocol needs beside our runs. Inside a request
the server acts as ``outbox_api`` (``outbox_writer``'s rights, granted directly, plus reading
its tenant's journal and registering its own client tools) under row-level security, scoped
to the key's tenant. The SQL is ``0020_api_keys.sql`` beside this file, frozen. The
downgrade drops the tables and revokes what this schema granted; the role stays
(cluster-wide; another database may use it), as in 0002.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0020_api_keys.sql")

DOWNGRADE = """
DROP TABLE {s}.assistant_runs;
DROP TABLE {s}.assistants;
DROP TABLE {s}.api_keys;
REVOKE ALL ON {s}.threads, {s}.runs, {s}.messages, {s}.model_turns, {s}.tool_batches,
    {s}.tool_calls, {s}.tool_results, {s}.orphaned_results, {s}.submissions, {s}.outbox,
    {s}.tenant_budgets, {s}.tools, {s}.journal, {s}.approvals, {s}.risk_policies,
    {s}.tool_switches, {s}.tenant_pauses, {s}.model_prices, {s}.platform_limits
    FROM outbox_api;
REVOKE ALL ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb),
                       {s}.enter_tenant_v1(text),
                       {s}.create_thread_v1(text, text, jsonb, jsonb),
                       {s}.start_run_v1(text, uuid, text, text, text[], text, text, text,
                                        text, integer, bigint, integer, double precision, text,
                                        numeric),
                       {s}.same_run_request_v1({s}.runs, uuid, text, text, text, text[]),
                       {s}.cancel_run_v1(text, uuid, text),
                       {s}.decide_approval_v1(text, bigint, text, text, text, text)
    FROM outbox_api;
REVOKE USAGE ON SCHEMA {s} FROM outbox_api;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DOWNGRADE)
