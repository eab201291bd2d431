"""One source for the defaults of new runs; one definition of each rule written twice.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-27

``run_defaults`` holds the step cap, loop limit and action timeout a new run takes when its
caller gives none, for ``start_run_v1`` and the Python writer API alike. ``run_over_v1``
(ended, or past the ``requires_action`` deadline), ``require_tenant_scope_v1``,
``keep_orphaned_results_v1`` and ``lane_loads_v1`` replace rules that were written in two
to four places; the functions that wrote them call them now. ``outbox_api`` loses EXECUTE
on the model-turn functions. The SQL is ``0030_run_defaults_and_one_rule_each.sql`` beside
this file, frozen. The downgrade makes the replaced functions again as the revisions that
last defined them made them, then drops what 0030 added.
"""

from __future__ import annotations

from outbox.migrate import frozen_sql, run_sql

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

UPGRADE = frozen_sql(__file__, "0030_run_defaults_and_one_rule_each.sql")


def _cut(name: str, start: str, end: str | None = None) -> str:
    text = frozen_sql(__file__, name)
    first = text.index(start)
    return text[first:] if end is None else text[first : text.index(end, first)]


def _before_0030() -> list[str]:
    """What 0030 replaced, as the revisions that last defined it made it: CREATE OR REPLACE
    and grants only, so running them again changes nothing else."""
    return [
        _cut("0021_record_tool_results.sql", "-- record_tool_results_v1: record terminal",
             '-- start_run_v1: "start a run'),
        _cut("0018_tenant_login_roles.sql", "-- enter_tenant_v1:", "-- decide_approval_v1:"),
        _cut("0026_deletes.sql", '-- start_run_v1: "start a run'),
        _cut("0021_record_tool_results.sql", "-- decide_approval_v1:", "-- stuck_runs:"),
    ]  # fmt: skip


DOWNGRADE = """
GRANT EXECUTE ON FUNCTION {s}.record_model_turns_v1(jsonb, jsonb),
                          {s}.record_model_turn_v1(jsonb, jsonb)
    TO outbox_api;
DROP FUNCTION {s}.lane_loads_v1();
DROP FUNCTION {s}.keep_orphaned_results_v1(jsonb);
DROP FUNCTION {s}.require_tenant_scope_v1(text, text);
DROP FUNCTION {s}.run_over_v1(text, timestamptz);
DROP TABLE {s}.run_defaults;
"""


def upgrade() -> None:
    run_sql(UPGRADE)


def downgrade() -> None:
    for sql in _before_0030():
        run_sql(sql)
    run_sql(DOWNGRADE)
