"""Client outputs: the deadline is decided at submission, and a resend stays a no-op.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

``submit_tool_outputs_v1`` (``0009_outputs_deadline_at_submission.sql``, frozen) now refuses outputs
submitted after the run's ``action_deadline`` by the database clock, whether or not a
relay's sweep has expired the run yet: they are kept in ``orphaned_results`` (reason
``deadline_passed``) and the function returns ``expired``. Outputs resent after the run
ended are no longer kept a second time (a call that has its result, or the same output
already kept). ``orphaned_results.reason`` takes the new value ``deadline_passed``.
The downgrade restores the function of revision 0003 and files such rows as
``run_ended`` again.
"""

from __future__ import annotations

from alembic import op

from outbox.migrate import frozen_sql, schema_sql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The functions file as this revision left it, frozen beside this file.
FUNCTIONS_0009 = frozen_sql(__file__, "0009_outputs_deadline_at_submission.sql")

# The function as migration 0003 created it, verbatim (one line is longer than 100).
SUBMIT_TOOL_OUTPUTS_0003 = r"""
CREATE OR REPLACE FUNCTION {s}.submit_tool_outputs_v1(
    p_tenant_id text, p_run_id uuid, p_outputs jsonb
) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_run        {s}.runs;
    v_given      text[];
    v_bad        text[];
    v_output     jsonb;
    v_call       {s}.tool_calls;
    v_remaining  integer;
    v_cap        integer := coalesce(
                     nullif(current_setting('outbox.max_payload_bytes', true), '')::integer,
                     262144);
    v_scope      text := nullif(current_setting('outbox.tenant_id', true), '');
BEGIN
    IF v_scope IS NOT NULL AND v_scope <> p_tenant_id THEN
        RAISE EXCEPTION 'this session is scoped to tenant %, not %', v_scope, p_tenant_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO v_run FROM {s}.runs WHERE id = p_run_id FOR UPDATE;
    IF NOT FOUND OR v_run.tenant_id <> p_tenant_id THEN
        RAISE EXCEPTION 'run % does not exist for tenant %', p_run_id, p_tenant_id
            USING ERRCODE = 'no_data_found', HINT = 'check the run id and the tenant';
    END IF;
    IF jsonb_typeof(p_outputs) IS DISTINCT FROM 'array' OR jsonb_array_length(p_outputs) = 0 THEN
        RAISE EXCEPTION 'outputs must be a non-empty JSON array'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'send [{"tool_call_id": "...", "output": ...} | {"tool_call_id": "...", "error": "..."}]';
    END IF;
    SELECT array_agg(o->>'tool_call_id') INTO v_given FROM jsonb_array_elements(p_outputs) o;
    IF array_position(v_given, NULL) IS NOT NULL
       OR (SELECT count(DISTINCT g) FROM unnest(v_given) g) <> cardinality(v_given) THEN
        RAISE EXCEPTION 'every output needs a tool_call_id, each at most once: %', v_given
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(g) INTO v_bad FROM unnest(v_given) g
    WHERE NOT EXISTS (SELECT 1 FROM {s}.tool_calls tc
                      WHERE tc.run_id = p_run_id AND tc.tool_call_id = g);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'tool call ids % are not calls of run %', v_bad, p_run_id
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'submit the ids the run lists as waiting (outbox runs show RUN)';
    END IF;
    SELECT array_agg(tc.tool_call_id) INTO v_bad FROM {s}.tool_calls tc
    WHERE tc.run_id = p_run_id AND tc.tool_call_id = ANY(v_given) AND tc.executor <> 'client';
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'tool calls % are run by the relay, not by the client', v_bad
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(o->>'tool_call_id') INTO v_bad FROM jsonb_array_elements(p_outputs) o
    WHERE octet_length(o::text) > v_cap;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'outputs for % are over the cap of % bytes', v_bad, v_cap
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'store large data elsewhere and submit a reference';
    END IF;

    IF v_run.status IN ('completed', 'failed', 'cancelled', 'expired') THEN
        INSERT INTO {s}.orphaned_results (tenant_id, run_id, batch_id, tool_call_ref,
                                          tool_call_id, status, output, error, reason, source)
        SELECT tc.tenant_id, tc.run_id, tc.batch_id, tc.id, tc.tool_call_id,
               CASE WHEN o ? 'error' THEN 'error' ELSE 'ok' END, o->'output',
               CASE WHEN o ? 'error' THEN coalesce(o->>'error', 'error') END, 'run_ended', 'client'
        FROM jsonb_array_elements(p_outputs) o
        JOIN {s}.tool_calls tc ON tc.run_id = p_run_id AND tc.tool_call_id = o->>'tool_call_id';
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, correlation_id, detail)
        VALUES (p_tenant_id, 'tool_outputs.orphaned', v_run.thread_id, p_run_id,
                v_run.correlation_id, jsonb_build_object('run_status', v_run.status,
                                                         'tool_call_ids', v_given));
        RETURN v_run.status;
    END IF;

    -- Every client call still waiting in the run's open batch must be answered together.
    SELECT array_agg(tc.tool_call_id ORDER BY tc.position) INTO v_bad
    FROM {s}.tool_calls tc
    JOIN {s}.tool_batches b ON b.id = tc.batch_id AND b.status = 'open'
    WHERE tc.run_id = p_run_id AND tc.executor = 'client' AND tc.status = 'pending'
      AND NOT (tc.tool_call_id = ANY(v_given));
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'incomplete outputs for run %: still missing %', p_run_id, v_bad
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'submit the outputs of every waiting call in one request';
    END IF;

    FOR v_output IN SELECT o FROM jsonb_array_elements(p_outputs) o LOOP
        SELECT * INTO v_call FROM {s}.tool_calls
        WHERE run_id = p_run_id AND tool_call_id = v_output->>'tool_call_id';
        PERFORM 1 FROM {s}.tool_batches WHERE id = v_call.batch_id FOR UPDATE;
        CONTINUE WHEN EXISTS (SELECT 1 FROM {s}.tool_results WHERE tool_call_ref = v_call.id);
        INSERT INTO {s}.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status, output,
                                      error, attempt, source)
        VALUES (v_call.id, v_call.tenant_id, p_run_id, v_call.batch_id,
                CASE WHEN v_output ? 'error' THEN 'error' ELSE 'ok' END, v_output->'output',
                CASE WHEN v_output ? 'error' THEN coalesce(v_output->>'error', 'error') END,
                0, 'client');
        UPDATE {s}.tool_calls
        SET status = CASE WHEN v_output ? 'error' THEN 'failed' ELSE 'succeeded' END,
            updated_at = now()
        WHERE id = v_call.id;
        UPDATE {s}.tool_batches
        SET pending = pending - 1,
            status = CASE WHEN pending - 1 = 0 THEN 'complete' ELSE status END,
            completed_at = CASE WHEN pending - 1 = 0 THEN now() END
        WHERE id = v_call.batch_id
        RETURNING pending INTO v_remaining;
        INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id, tool_call_ref,
                                 tool_call_id, correlation_id, detail)
        VALUES (p_tenant_id, 'tool_result.stored', v_run.thread_id, p_run_id, v_call.batch_id,
                v_call.id, v_call.tool_call_id, v_run.correlation_id,
                jsonb_build_object('source', 'client'));
        IF v_remaining = 0 THEN
            INSERT INTO {s}.outbox (tenant_id, kind, dedup_key, thread_id, run_id, batch_id,
                                    correlation_id)
            VALUES (p_tenant_id, 'deliver_batch', 'deliver:' || v_call.batch_id,
                    v_run.thread_id, p_run_id, v_call.batch_id, v_run.correlation_id)
            ON CONFLICT (dedup_key) DO NOTHING;
            INSERT INTO {s}.journal (tenant_id, event, thread_id, run_id, batch_id,
                                     correlation_id)
            VALUES (p_tenant_id, 'batch.complete', v_run.thread_id, p_run_id, v_call.batch_id,
                    v_run.correlation_id);
        END IF;
    END LOOP;

    UPDATE {s}.runs SET status = 'in_progress', action_deadline = NULL, updated_at = now()
    WHERE id = p_run_id AND status = 'requires_action'
      AND NOT EXISTS (SELECT 1 FROM {s}.tool_calls tc
                      WHERE tc.run_id = p_run_id AND tc.executor = 'client'
                        AND tc.status = 'pending');
    RETURN (SELECT status FROM {s}.runs WHERE id = p_run_id);
END $$;
REVOKE ALL ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.submit_tool_outputs_v1(text, uuid, jsonb) TO outbox_writer;
"""  # noqa: E501


REASONS_0001 = "'batch_closed', 'run_ended', 'duplicate', 'fenced'"


def _reasons(values: str) -> None:
    """Replace the CHECK on ``orphaned_results.reason`` (a scan of that small table)."""
    op.execute(
        schema_sql(
            "ALTER TABLE {s}.orphaned_results DROP CONSTRAINT orphaned_results_reason_check, "
            f"ADD CONSTRAINT orphaned_results_reason_check CHECK (reason IN ({values}))"
        )
    )


def upgrade() -> None:
    _reasons(REASONS_0001 + ", 'deadline_passed'")
    # CREATE OR REPLACE keeps the function's grants.
    op.execute(schema_sql(FUNCTIONS_0009))


def downgrade() -> None:
    op.execute(schema_sql(SUBMIT_TOOL_OUTPUTS_0003))
    op.execute(
        schema_sql(
            "UPDATE {s}.orphaned_results SET reason = 'run_ended' WHERE reason = 'deadline_passed'"
        )
    )
    _reasons(REASONS_0001)
