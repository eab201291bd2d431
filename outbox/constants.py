"""The run status sets and the outbox's dedup-key formats, defined once for Python.

SQL has one twin of each, as functions of ``sql/runs.sql``:
``run_active_v1(status)``, ``run_ended_v1(status)``, ``deliver_key_v1(batch_id)``,
``tool_call_key_v1(tool_call_ref)`` and ``model_turn_key_v1(run_id, step_no)``; the relay's
and the writer's named queries and the SQL functions call those, and
``tests/integration/test_record_tool_results.py`` checks that both sides agree.

A dedup key names one unit of work forever: the outbox's unique ``dedup_key`` turns a second
enqueue of the same work (a redelivered event, two results racing to complete a batch) into
``ON CONFLICT DO NOTHING``. Changing a format would let work queued before the change be
queued again, so a format never changes; a new one gets a new name.
"""

from __future__ import annotations

import uuid

# A run that can still move: the one-active-run-per-thread index covers exactly these
# (``orm.Run``'s partial unique index).
ACTIVE: tuple[str, ...] = ("queued", "in_progress", "requires_action")
# A run that is over: nothing of it is started again, results for it are orphaned.
ENDED: tuple[str, ...] = ("completed", "failed", "cancelled", "expired")


def deliver_key(batch_id: int) -> str:
    """The dedup key of a batch's one delivery (``deliver_batch``)."""
    return f"deliver:{batch_id}"


def tool_call_key(tool_call_ref: int) -> str:
    """The dedup key of a tool call's outbox row (``tool_call``)."""
    return f"tool_call:{tool_call_ref}"


def model_turn_key(run_id: uuid.UUID | str, step_no: int) -> str:
    """The dedup key of a run's model turn at a step (``model_turn``)."""
    return f"model_turn:{run_id}:{step_no}"
