"""Approvals: tool calls that wait for a reviewer before they run.

A call waits when its tier's risk policy says ``approve`` or its tool ``requires_approval``
(``outbox.policy``). It is recorded with the status ``awaiting_approval``, one row in
``outbox.approvals`` (who may decide, a deadline, the digest of its exact arguments) and an
outbox row that is due at ``'infinity'``. A decision is one call of ``decide_approval_v1``
(sql/approvals.sql), the same for this module, the CLI and backends in SQL:

* **approve**: the outbox row becomes due and the relay runs the call once. The approval
  is consumed by its status change: a second decision is refused, and a retry, a rescue
  or a replay of the call reuses its one outbox row and idempotency key, so one approval
  never becomes two executions;
* **deny**: the row becomes due and the relay answers the call "denied by reviewer ...",
  which the model sees; the run goes on;
* **no decision by the deadline** (or the run ended): the relay's sweep (``expire_due``)
  denies it the same way. Nothing is ever approved by default.

The claim checks the approval again (relay/queries/relay.sql, ``stop``): a row made due by
hand is answered "not approved", never run.
"""

from __future__ import annotations

from typing import Any

import psycopg

from outbox import calls, policy, writer
from outbox.errors import NotFound
from outbox.statements import Row, fetch_all, fetch_one, pg

Q = policy.Q
STATUSES = ("pending", "approved", "denied", "expired")


def list_approvals(
    conn: psycopg.Connection[Any],
    status: str | None = "pending",
    tenant_id: str | None = None,
    limit: int = 100,
) -> list[Row]:
    """Approvals of ``status`` (one of ``STATUSES``; None: every status), oldest first,
    with the call's arguments."""
    return fetch_all(conn, Q.approvals, {"status": status, "tenant_id": tenant_id, "limit": limit})


def pending_of_run(conn: psycopg.Connection[Any], run_id: Any) -> list[Row]:
    """A run's calls waiting for a reviewer, oldest first."""
    return fetch_all(conn, Q.approvals_of_run, {"run_id": run_id})


def get(conn: psycopg.Connection[Any], approval_id: int) -> Row:
    row = fetch_one(conn, Q.approval, {"id": approval_id})
    if row is None:
        raise NotFound(
            f"approval {approval_id} does not exist", hint="`outbox approvals list` shows them"
        )
    return row


def decide(
    db: Any,
    approval_id: int,
    decision: str,
    *,
    actor: str,
    reason: str = "",
    digest: str | None = None,
    tenant_id: str | None = None,
) -> Row:
    """``decision`` ``"approve"`` or ``"deny"`` a waiting call (in the caller's transaction,
    never committing).

    ``digest``, when given, must be the arguments digest the reviewer was shown (the
    ``arguments_digest`` of ``list_approvals``). ``tenant_id``: the tenant acting; an
    operator's connection may leave it out and act for the approval's own tenant.
    Raises ``InvalidTransition`` when it was decided already, its deadline passed or its
    run ended; ``NotPermitted`` when ``actor`` is not one of its approvers.
    """
    conn = pg(db)
    tenant = tenant_id or get(conn, approval_id)["tenant_id"]
    params = {
        "tenant_id": tenant,
        "id": approval_id,
        "decision": decision,
        "actor": actor,
        "reason": reason,
        "digest": digest,
    }
    (row,) = writer.run_call(conn, calls.Call(Q.decide, params, scope=tenant))
    return row


def expire_due(
    conn: psycopg.Connection[Any], worker: str | None = None, limit: int = 500
) -> list[Row]:
    """Deny what nobody decided in time (and approvals of runs that ended): their calls
    become due and the relay answers them with the denial. The relay's maintenance runs this."""
    return fetch_all(conn, Q.expire_approvals, {"limit": limit, "worker": worker})
