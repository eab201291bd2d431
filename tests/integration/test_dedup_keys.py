"""Each dedup key admits one row per thing it names, whichever tenant a second row claims.

The keys end with ``tenant_id`` (docs/scale.md), and each was unique over a column that
names one row of one tenant (docs/guarantees.md, "Inside the database"). A second row is
written here by hand, as the schema's owner and past every ``ON CONFLICT``, copying the
first: with the first row's tenant it meets the dedup key; with another tenant's it is
refused too (the foreign keys keep a row in its run's, batch's and call's tenant), so no
tenant can hold a second row of a run's step, a call or a batch.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outbox import writer
from tests.helpers import add_tool, new_run, turn

A, B = "tenant-a", "tenant-b"

# dedup key: the copy of the first row of tenant A, with %(tenant)s as its tenant.
COPIES: dict[str, str] = {
    "model_turns_run_step_key": """
        INSERT INTO outbox.model_turns (tenant_id, run_id, step_no, message_id, response_id,
                                        input_tokens, output_tokens)
        SELECT %(tenant)s, run_id, step_no, message_id, response_id, input_tokens,
               output_tokens
        FROM outbox.model_turns WHERE tenant_id = 'tenant-a'""",
    "tool_batches_run_step_key": """
        INSERT INTO outbox.tool_batches (tenant_id, thread_id, run_id, message_id, step_no,
                                         size, pending)
        SELECT %(tenant)s, thread_id, run_id, message_id, step_no, size, pending
        FROM outbox.tool_batches WHERE tenant_id = 'tenant-a'""",
    "tool_calls_run_call_key": """
        INSERT INTO outbox.tool_calls (tenant_id, thread_id, run_id, batch_id, message_id,
                                       position, tool_call_id, tool_name, tool_version,
                                       arguments_raw, arguments, arguments_hash,
                                       executor, idempotency_key)
        SELECT %(tenant)s, thread_id, run_id, batch_id, message_id, position + 1,
               tool_call_id, tool_name, tool_version, arguments_raw, arguments,
               arguments_hash, executor, idempotency_key || '-again'
        FROM outbox.tool_calls WHERE tenant_id = 'tenant-a'""",
    "tool_results_pkey": """
        INSERT INTO outbox.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status,
                                         output, source)
        SELECT tool_call_ref, %(tenant)s, run_id, batch_id, status, output, source
        FROM outbox.tool_results WHERE tenant_id = 'tenant-a'""",
    "submissions_one_per_batch": """
        INSERT INTO outbox.submissions (tenant_id, run_id, batch_id, outputs_count)
        SELECT %(tenant)s, run_id, batch_id, outputs_count
        FROM outbox.submissions WHERE tenant_id = 'tenant-a'""",
    "outbox_dedup_key": """
        INSERT INTO outbox.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                                   tool_call_ref, tool_name, payload)
        SELECT %(tenant)s, kind, dedup_key, thread_id, run_id, batch_id, tool_call_ref,
               tool_name, payload
        FROM outbox.outbox WHERE tenant_id = 'tenant-a' AND kind = 'tool_call'""",
}


def first_rows(conn: psycopg.Connection[Any]) -> None:
    """Tenant A: a run whose model turn asked for one call, its result, the batch's
    delivery and submission; tenant B: a run of its own, for a second row to name."""
    add_tool(conn)
    for tenant in (A, B):
        run = new_run(conn, tenant=tenant, tools=["lookup_order"])
        if tenant == B:
            continue
        rec = writer.record_model_turn(
            conn, turn(run, 1, ("call_1", "lookup_order", {"order_id": "1"}))
        )
        conn.execute(
            "INSERT INTO outbox.tool_results (tool_call_ref, tenant_id, run_id, batch_id, "
            "status, output, source) VALUES (%s, %s, %s, %s, 'ok', '{}', 'operator')",
            [rec.tool_call_refs[0], A, run.id, rec.batch_id],
        )
        conn.execute(
            "INSERT INTO outbox.submissions (tenant_id, run_id, batch_id, outputs_count) "
            "VALUES (%s, %s, %s, 1)",
            [A, run.id, rec.batch_id],
        )
    conn.commit()


@pytest.mark.parametrize("key", sorted(COPIES))
def test_a_second_row_of_the_same_tenant_meets_the_dedup_key(conn, key):
    first_rows(conn)
    with pytest.raises(psycopg.errors.UniqueViolation) as refused:
        conn.execute(COPIES[key], {"tenant": A})
    assert refused.value.diag.constraint_name == key


@pytest.mark.parametrize("key", sorted(COPIES))
def test_a_second_row_claiming_another_tenant_is_refused_too(conn, key):
    first_rows(conn)
    with pytest.raises(psycopg.errors.IntegrityError):
        conn.execute(COPIES[key], {"tenant": B})
