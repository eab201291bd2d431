"""Model options reach the model: ``start_run_v3`` takes them, checked, and journals them.

Revision ID: 0049
Revises: 0048
Create Date: 2026-12-07

``start_run_v3`` is ``start_run_v2`` with ``p_model_options``: what the run passes to its
model on every turn beside the history (sampling, reasoning, the output cap, the service
tier, the prompt cache key and identifiers, logprobs, ``include``, the tool options,
``max_tool_calls`` and the context budget), checked by ``model_options_problem_v1``,
stored in ``runs.model_options`` in the statement that makes the run and journaled with
``run.created``; ``start_run_v2`` calls it without them. ``run_span_events_v1`` hands
the trace exporter a turn's cached tokens too, for its ``chat`` span. The SQL is
``0049_model_options_reach_the_model.sql`` beside this file, frozen. The downgrade makes
``start_run_v2`` again as 0033 made it, then drops what 0049 added.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0049_model_options_reach_the_model.sql")


def _span_events_of_0042() -> str:
    text = frozen_sql(__file__, "0042_spans_from_the_database.sql")
    first = text.index("-- run_span_events_v1: what the trace exporter")
    return text[first : text.index("REVOKE ALL ON FUNCTION {s}.run_span_events_v1", first)]


def _start_run_v2_of_0033() -> str:
    text = frozen_sql(__file__, "0033_run_trace_context.sql")
    first = text.index('-- start_run_v2: "start a run')
    return text[first : text.index("-- start_run_v1:", first)]


DOWNGRADE = """
DROP FUNCTION {s}.start_run_v3(text, uuid, text, text, text[], text, text, text, text, integer,
                               bigint, integer, double precision, text, numeric, text, text,
                               jsonb);
DROP FUNCTION {s}.model_options_problem_v1(jsonb);
COMMENT ON COLUMN {s}.runs.model_options IS
    'what the run passes to its model beside the history and the tools: tool_choice, '
    'parallel_tool_calls, format, verbosity (Responses API terms; outbox/providers.py '
    'writes them per API)';
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    run_sql(_start_run_v2_of_0033())  # before start_run_v3 goes: v2 calls it until then
    run_sql(_span_events_of_0042())
    run_sql(DOWNGRADE)
