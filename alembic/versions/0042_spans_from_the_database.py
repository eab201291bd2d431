"""Spans built from what the database records, by a trace exporter, not in the relay.

Revision ID: 0042
Revises: 0041
Create Date: 2026-11-27

``record_tool_results_v1`` and ``record_model_turns_v1`` keep each attempt's span, as the
relay timed it, in the journal event they already write; ``runs_span_due`` marks every
run that ends ``agent_span_due`` (0037 marked cancelled runs only);
``runs.spans_taken_until`` is an exporter's lease on a run; ``run_span_events_v1``
hands the trace exporter (``outbox/traces.py``, ``outbox traces export``) the events it
builds a run's spans from. The SQL is ``0042_spans_from_the_database.sql`` beside this
file, frozen. The downgrade makes the two functions again as 0040 made them and drops the
trigger and the function.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0042"
down_revision = "0041"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0042_spans_from_the_database.sql")

DROP = """
DROP FUNCTION {s}.run_span_events_v1(uuid[], timestamptz);
DROP TRIGGER runs_span_due ON {s}.runs;
DROP FUNCTION {s}.runs_mark_span_due();
ALTER TABLE {s}.runs DROP COLUMN spans_taken_until;
COMMENT ON COLUMN {s}.runs.agent_span_due IS
    'cancelled by a backend or an operator, and no relay has yet recorded its invoke_agent '
    'span (the relay''s sweep takes it)';
"""


def _of_0040() -> str:
    """``record_tool_results_v1`` and ``record_model_turns_v1`` as 0040 made them."""
    text = frozen_sql(__file__, "0040_payloads.sql")

    def cut(start: str, end: str) -> str:
        first = text.index(start)
        return text[first : text.index(end, first)]

    return cut("-- record_tool_results_v1: record terminal", "-- end_run_v1:") + cut(
        "-- record_model_turns_v1: record model responses", "-- run_document_v1:"
    )


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(DROP + _of_0040())
