-- Spans: what the trace exporter reads of the journal to build a run's spans. `{s}` is the
-- schema.


-- run_span_events_v1: what the trace exporter (outbox/trace_export.py) builds a run's chat and
-- execute_tool spans from: each journal event of the runs that carries an attempt's span
-- as the relay timed it (model_turn.recorded, tool_result.stored, *.retry_scheduled,
-- *.quarantined, *.outcome_unknown, write.fenced), and each run's run.created (its absence
-- says the journal was pruned past the run's start: its attempts' spans are gone). Only
-- what a span carries leaves the journal (no payload reference); an error's text is in
-- "error", which the exporter puts in a span only with content capture on. Runs as the
-- schema owner (SECURITY DEFINER): outbox_relay, whose role the exporter uses, reads no
-- journal otherwise. p_since (the earliest creation of the runs) spares the journal's
-- partitions older than any of them: every event of a run is journaled after it began.
CREATE OR REPLACE FUNCTION {s}.run_span_events_v1(p_run_ids uuid[], p_since timestamptz)
RETURNS TABLE (run_id uuid, event text, at timestamptz, tool_call_ref bigint, attempt integer,
               detail jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.run_id, j.event, j.at, j.tool_call_ref, j.attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'span', j.detail->'span', 'step_no', j.detail->'step_no',
               'input_tokens', j.detail->'input_tokens',
               'output_tokens', j.detail->'output_tokens',
               'cached_tokens', j.detail->'cached_tokens',
               'status', j.detail->'status', 'error', j.detail->'error'))
    FROM {s}.journal j
    WHERE j.run_id = ANY(p_run_ids) AND j.at >= p_since
      AND (j.detail ? 'span' OR j.event = 'run.created')
    ORDER BY j.run_id, j.id
$$;
REVOKE ALL ON FUNCTION {s}.run_span_events_v1(uuid[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {s}.run_span_events_v1(uuid[], timestamptz)
    TO outbox_relay, outbox_auditor;