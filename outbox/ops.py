"""Operator actions: inspect the queue and runs, requeue, quarantine, release, reconcile, prune.

The CLI (``outbox queue|runs|requeue|...``) is a thin shell over these functions, so anything
an operator does at 3 a.m. can also be scripted or tested. Each action:

- runs in the caller's transaction and never commits (the CLI commits when it returns);
- locks what it changes (outbox row, then tool call) and checks the transition first: one
  that makes no sense raises ``InvalidTransition`` with the reason and a hint, before any
  write, so a refusal changes nothing;
- is journaled as ``operator.<action>`` with the actor who asked.

Ids: a run is its uuid or an unambiguous prefix of it; a tool call is its number (``12`` or
``call:12``); an outbox row is ``outbox:7``. Requeue and release keep the attempt count (the
fencing token is never handed out twice) and grant at least one more attempt. A call whose
outcome is unknown is never put back by requeue or release: only ``reconcile`` settles it,
with the operator's word on whether the side effect happened (docs/guarantees.md, invariant 5).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from outbox import approvals, calls
from outbox.constants import ENDED
from outbox.errors import InvalidInput, InvalidTransition, NotFound, OutboxError
from outbox.schemas import ToolResultIn
from outbox.sql import queries
from outbox.statements import fetch_all, fetch_one, journal
from outbox.writer import record_tool_result

Q = queries("ops.sql")
Row = dict[str, Any]

RESCAN_IDS = 1000  # journal ids re-read below the newest seen when following (commit order)
FOLLOW_POLL_S = 1.0  # seconds between polls of ``journal tail --follow``
REQUEUE_STATES = ("quarantined", "delayed")
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}  # seconds per unit
_CALL = re.compile(r"^(?:call:|tc:)?(\d+)$")
_OUTBOX = re.compile(r"^(?:outbox:|ob:)(\d+)$")
_RUN_PREFIX = re.compile(r"^[0-9a-f-]{1,36}$")


# -- parsing ----------------------------------------------------------------------------


def parse_age(text: str) -> timedelta:
    """``"30d"``, ``"12h"``, ``"15m"``, ``"90s"`` or ``"2w"`` as a timedelta."""
    match = _AGE.match(text)
    if not match:
        raise InvalidInput(f"{text!r} is not an age", hint="write it like 90s, 15m, 12h, 30d, 2w")
    return timedelta(seconds=float(match.group(1)) * _AGE_UNITS[match.group(2)])


def parse_since(text: str) -> datetime:
    """An age (``"2h"``: that long ago) or an ISO date or time (naive means UTC)."""
    if _AGE.match(text):
        return datetime.now(UTC) - parse_age(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError as err:
        raise InvalidInput(
            f"{text!r} is neither an age nor a date",
            hint="write an age (2h, 30d) or an ISO time (2026-11-23T04:00)",
        ) from err
    return when if when.tzinfo else when.replace(tzinfo=UTC)


# -- inspection -------------------------------------------------------------------------


def queue_stats(conn: psycopg.Connection[Any], window_min: int = 15) -> Row:
    """Queue depth per kind and per tool, the oldest due row's lag, claim-to-start p50/p99."""
    by_kind = fetch_all(conn, Q.queue_by_kind, {})
    claim = fetch_one(conn, Q.claim_to_start, {"window_min": window_min})
    assert claim is not None
    return {
        "by_kind": by_kind,
        "by_tool": fetch_all(conn, Q.queue_by_tool, {}),
        "oldest_ready_lag_s": max((r["lag_s"] for r in by_kind), default=0.0),
        "claim_to_start": {"window_min": window_min, **claim},
    }


def transaction_holders(conn: psycopg.Connection[Any], older_than_s: float = 10.0) -> Row:
    """Sessions whose transaction, open ``older_than_s`` or more, holds rows of the outbox's
    tables (locked or written), or that another session waits on (``waiting``): what holds
    back a run the relay's completer skips (``complete.run_held``), a sweep that gives up
    (``maintenance.sweep_waits``) or a writer that waits. ``hidden`` counts the sessions
    of other roles holding rows whose times the caller may not read (PostgreSQL's
    ``pg_read_all_stats``)."""
    rows = fetch_all(conn, Q.transaction_holders, {"older_than_s": older_than_s})
    shown = [{k: v for k, v in r.items() if k != "visible"} for r in rows if r["visible"]]
    return {"sessions": shown, "hidden": len(rows) - len(shown), "older_than_s": older_than_s}


def list_runs(
    conn: psycopg.Connection[Any],
    *,
    status: str | None = None,
    tenant_id: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
) -> list[Row]:
    """Runs, newest first."""
    params = {"status": status, "tenant_id": tenant_id, "since": since, "limit": limit}
    return fetch_all(conn, Q.list_runs, params)


def resolve_run(conn: psycopg.Connection[Any], ident: str) -> Row:
    """The run named by its uuid or an unambiguous prefix of it."""
    prefix = ident.strip().lower()
    if not _RUN_PREFIX.match(prefix):
        raise InvalidInput(f"{ident!r} is not a run id", hint="give the run's uuid or its start")
    rows = fetch_all(conn, Q.runs_by_prefix, {"prefix": prefix})
    if not rows:
        raise NotFound(f"run {ident} does not exist", hint="`outbox runs list` shows runs")
    if len(rows) > 1:
        raise InvalidInput(
            f"run prefix {ident!r} is ambiguous: {rows[0]['id']}, {rows[1]['id']}, ...",
            hint="give more characters of the run id",
        )
    return rows[0]


def show_run(conn: psycopg.Connection[Any], ident: str) -> Row:
    """A run, its timeline (every journal event about it, in order), the client calls
    it waits for (``pending_client_calls``: what to submit outputs for; empty unless the
    run is in ``requires_action``) and its calls waiting for a reviewer
    (``pending_approvals``: see ``outbox approvals``)."""
    run = resolve_run(conn, ident)
    waiting = calls.pending_client_calls(run["id"])
    return {
        "run": run,
        "timeline": fetch_all(conn, Q.run_timeline, {"run_id": run["id"]}),
        "pending_client_calls": fetch_all(conn, waiting.query, waiting.params)
        if run["status"] == "requires_action"
        else [],
        "pending_approvals": approvals.pending_of_run(conn, run["id"]),
    }


# -- targets of operator actions --------------------------------------------------------


@dataclass
class Target:
    """What an action applies to: a queued row and/or a tool call, locked."""

    label: str
    outbox: Row | None
    call: Row | None

    @property
    def run_status(self) -> str | None:
        source = self.call or self.outbox
        return None if source is None else source.get("run_status")

    def state(self) -> str:
        """The queue state an operator sees: ready, delayed, leased, quarantined or none."""
        if self.outbox is None:
            return "not queued"
        if self.outbox["status"] == "ready" and self.outbox["delayed"]:
            return "delayed"
        return str(self.outbox["status"])


@dataclass
class Change:
    """One operator transition, applied or (dry run, bulk skip) only described."""

    target: str
    action: str
    from_state: str
    to_state: str
    applied: bool
    outbox_id: int | None = None
    tool_call_ref: int | None = None
    run_id: uuid.UUID | None = None
    note: str | None = None

    def as_dict(self) -> Row:
        return asdict(self)


def load_target(conn: psycopg.Connection[Any], ident: str) -> Target:
    """Resolve and lock ``12`` / ``call:12`` (a tool call) or ``outbox:7`` (an outbox row)."""
    text = ident.strip()
    if match := _OUTBOX.match(text):
        row = fetch_one(conn, Q.lock_outbox, {"id": int(match.group(1))})
        if row is None:
            raise NotFound(f"outbox row {match.group(1)} does not exist", hint=_QUEUE_HINT)
        call = None
        if row["tool_call_ref"] is not None:
            call = fetch_one(conn, Q.lock_call, {"id": row["tool_call_ref"]})
        return Target(f"outbox row {row['id']}", row, call)
    if match := _CALL.match(text):
        ref = int(match.group(1))
        row = fetch_one(conn, Q.lock_outbox_of_call, {"tool_call_ref": ref})
        call = fetch_one(conn, Q.lock_call, {"id": ref})
        if call is None:
            raise NotFound(f"tool call {ref} does not exist", hint=_QUEUE_HINT)
        return Target(f"tool call {ref}", row, call)
    raise InvalidInput(
        f"{ident!r} is not a tool call or outbox row id",
        hint="a tool call is 12 or call:12, an outbox row is outbox:7",
    )


_QUEUE_HINT = "`outbox queue stats` and `outbox runs show RUN` show the ids"


def _refuse(action: str, target: Target, why: str, hint: str | None = None) -> InvalidTransition:
    return InvalidTransition(f"cannot {action} {target.label}: {why}", hint=hint)


def _check_call_may_run(action: str, target: Target) -> None:
    """Refuse to put work back when running it again would be wrong."""
    call = target.call
    if call is not None:
        ref = call["id"]
        if call["status"] in ("succeeded", "failed"):
            raise _refuse(
                action,
                target,
                f"it {call['status']} and has its result; running it again would repeat its "
                "side effect",
                hint="a finished call is never executed again",
            )
        if call["status"] == "awaiting_approval":
            raise _refuse(
                action,
                target,
                "it waits for a reviewer's decision",
                hint="`outbox approvals list` shows it; approve or deny it there",
            )
        if call["status"] == "outcome_unknown":
            raise _refuse(
                action,
                target,
                "its outcome is unknown: an earlier attempt may have reached the tool",
                hint=f"settle it with `outbox reconcile {ref} --happened --result JSON` or "
                f"`outbox reconcile {ref} --not-happened`",
            )
        if call["batch_status"] != "open":
            raise _refuse(
                action,
                target,
                f"its batch is {call['batch_status']}: a new result would only be orphaned",
            )
    if target.run_status in ENDED:
        raise _refuse(action, target, f"its run is {target.run_status}")


def _check_not_leased(action: str, target: Target) -> None:
    row = target.outbox
    if row is not None and row["status"] == "leased":
        raise _refuse(
            action,
            target,
            f"worker {row['lease_owner']} holds its lease (attempt {row['attempts']}) until "
            f"{row['lease_expires_at']:%Y-%m-%d %H:%M:%S%z}",
            hint="wait for the attempt to finish or for its lease to expire (the relay "
            "rescues expired leases)",
        )


def _journal(
    conn: psycopg.Connection[Any],
    action: str,
    target: Target,
    actor: str,
    detail: Row,
) -> None:
    source = target.call or target.outbox
    assert source is not None
    row = target.outbox or {}
    call = target.call or {}
    journal(
        conn,
        f"operator.{action}",
        source["tenant_id"],
        thread_id=source.get("thread_id"),
        run_id=source.get("run_id"),
        batch_id=source.get("batch_id"),
        tool_call_ref=call.get("id", row.get("tool_call_ref")),
        tool_call_id=call.get("tool_call_id"),
        outbox_id=row.get("id"),
        correlation_id=source.get("correlation_id"),
        attempt=row.get("attempts", call.get("attempts")),
        actor=actor,
        detail=detail,
    )


def _change(target: Target, action: str, to_state: str, applied: bool, note: str | None) -> Change:
    source = target.call or target.outbox or {}
    return Change(
        target=target.label,
        action=action,
        from_state=target.state(),
        to_state=to_state,
        applied=applied,
        outbox_id=(target.outbox or {}).get("id"),
        tool_call_ref=(target.call or {}).get("id"),
        run_id=source.get("run_id"),
        note=note,
    )


def _make_ready(
    conn: psycopg.Connection[Any],
    target: Target,
    action: str,
    actor: str,
    *,
    clear_dispatch: bool = False,
    detail: Row | None = None,
) -> Change:
    change = _change(target, action, "ready", True, None)
    if target.outbox is not None:
        fetch_one(conn, Q.make_ready, {"id": target.outbox["id"]})
    else:
        assert target.call is not None
        target.outbox = fetch_one(conn, Q.requeue_call, {"tool_call_ref": target.call["id"]})
        assert target.outbox is not None
        change.outbox_id = target.outbox["id"]
    if target.call is not None:
        conn.execute(
            Q.set_call_status,
            {
                "id": target.call["id"],
                "status": "pending",
                "note": f"{action} by {actor}",
                "clear_dispatch": clear_dispatch,
            },
        )
    _journal(conn, action, target, actor, {"from": change.from_state, **(detail or {})})
    return change


# -- requeue, release, quarantine -------------------------------------------------------


def _check_requeue(target: Target) -> None:
    _check_call_may_run("requeue", target)
    _check_not_leased("requeue", target)
    state = target.state()
    if state == "not queued" and not (target.call and target.call["status"] == "quarantined"):
        raise _refuse("requeue", target, "nothing is queued for it", hint=_not_queued_hint(target))
    if state == "ready":
        assert target.outbox is not None
        raise _refuse(
            "requeue",
            target,
            f"it is already ready (due since {target.outbox['available_at']:%H:%M:%S})",
            hint="a worker will claim it; `outbox queue stats` shows the lag",
        )


def _not_queued_hint(target: Target) -> str:
    if target.call is not None and target.call["executor"] == "client":
        return "a client tool runs in the backend: it submits the output"
    return "its work is done or was never queued"


def requeue(
    conn: psycopg.Connection[Any], ident: str, *, actor: str, dry_run: bool = False
) -> Change:
    """Put quarantined or delayed work back in the queue, due now (attempts kept)."""
    target = load_target(conn, ident)
    _check_requeue(target)
    if dry_run:
        return _change(target, "requeue", "ready", False, "dry run")
    return _make_ready(conn, target, "requeue", actor)


def requeue_matching(
    conn: psycopg.Connection[Any],
    *,
    state: str,
    actor: str,
    tool: str | None = None,
    since: datetime | None = None,
    dry_run: bool = False,
) -> list[Change]:
    """Requeue every row in ``state`` (quarantined or delayed), optionally of one tool and
    last claimed (or created) since a time. Rows that may not be requeued (a call whose
    outcome is unknown, a run that ended) are reported as skipped with the reason."""
    if state not in REQUEUE_STATES:
        raise InvalidTransition(
            f"cannot requeue {state} work: requeue takes quarantined or delayed rows",
            hint="succeeded and failed calls are never run again; settle outcome_unknown "
            "calls with `outbox reconcile`",
        )
    ids = fetch_all(conn, Q.select_requeue, {"state": state, "tool": tool, "since": since})
    changes: list[Change] = []
    for row in ids:
        target = load_target(conn, f"outbox:{row['id']}")
        try:
            _check_requeue(target)
        except InvalidTransition as err:
            changes.append(_change(target, "requeue", target.state(), False, err.args[0]))
            continue
        if dry_run:
            changes.append(_change(target, "requeue", "ready", False, "dry run"))
        else:
            changes.append(_make_ready(conn, target, "requeue", actor, detail={"bulk": True}))
    return changes


def release(conn: psycopg.Connection[Any], ident: str, *, actor: str) -> Change:
    """Take quarantined work out of quarantine: ready again, due now (attempts kept)."""
    target = load_target(conn, ident)
    _check_call_may_run("release", target)
    if target.state() != "quarantined":
        raise _refuse(
            "release",
            target,
            f"it is not quarantined (it is {target.state()})",
            hint="release undoes a quarantine; `outbox requeue` runs delayed work now",
        )
    return _make_ready(conn, target, "release", actor)


def quarantine(conn: psycopg.Connection[Any], ident: str, *, reason: str, actor: str) -> Change:
    """Park queued work for an operator: no worker claims it until it is released."""
    if not reason.strip():
        raise InvalidInput("a quarantine needs a reason", hint="pass --reason TEXT")
    target = load_target(conn, ident)
    call = target.call
    if call is not None and call["status"] in ("succeeded", "failed", "cancelled"):
        raise _refuse("quarantine", target, f"it {call['status']}: there is nothing to hold")
    _check_not_leased("quarantine", target)
    state = target.state()
    if state == "not queued":
        raise _refuse(
            "quarantine", target, "nothing is queued for it", hint=_not_queued_hint(target)
        )
    if state == "quarantined":
        assert target.outbox is not None
        raise _refuse(
            "quarantine", target, f"it is already quarantined ({target.outbox['last_error']})"
        )
    assert target.outbox is not None
    note = f"quarantined by {actor}: {reason}"
    change = _change(target, "quarantine", "quarantined", True, reason)
    fetch_one(conn, Q.park, {"id": target.outbox["id"], "error": note})
    if call is not None:
        conn.execute(
            Q.set_call_status,
            {"id": call["id"], "status": "quarantined", "note": note, "clear_dispatch": False},
        )
    _journal(conn, "quarantine", target, actor, {"from": state, "reason": reason})
    return change


# -- reconcile --------------------------------------------------------------------------


def reconcile(
    conn: psycopg.Connection[Any],
    ident: str,
    *,
    happened: bool,
    actor: str,
    result: Any = None,
) -> Change:
    """Settle a tool call whose outcome is unknown, on the operator's word.

    ``happened=True``: the side effect took place; ``result`` is recorded as the call's
    output through ``writer.record_tool_result`` (source ``operator``), so the batch
    completes and is delivered exactly as if the relay had recorded it, and the queued row
    leaves the queue. ``happened=False``: it did not; the call is queued again (attempts
    kept, the dispatch mark cleared) and the relay executes it.
    """
    target = load_target(conn, ident)
    call = target.call
    if call is None:
        raise InvalidInput(f"{target.label} is not a tool call", hint="reconcile takes a call id")
    if call["status"] != "outcome_unknown":
        raise _refuse(
            "reconcile",
            target,
            f"it is {call['status']}, not outcome_unknown: reconcile settles calls whose "
            "outcome is unknown",
            hint="`outbox requeue` or `outbox release` move quarantined work",
        )
    _check_not_leased("reconcile", target)
    if not happened:
        if call["batch_status"] != "open" or target.run_status in ENDED:
            raise _refuse(
                "reconcile",
                target,
                f"its run is {target.run_status} and its batch {call['batch_status']}: "
                "nothing would use a new attempt",
                hint="record what happened instead (--happened --result JSON)",
            )
        return _make_ready(
            conn, target, "reconcile", actor, clear_dispatch=True, detail={"happened": False}
        )
    stored = record_tool_result(
        conn,
        ToolResultIn(
            tenant_id=call["tenant_id"],
            tool_call_ref=call["id"],
            status="ok",
            output=result,
            source="operator",
            attempt=call["attempts"],
            worker=f"operator:{actor}",
        ),
    )
    change = _change(target, "reconcile", f"result {stored.outcome}", True, None)
    if target.outbox is not None:
        conn.execute(Q.forget, {"id": target.outbox["id"]})
    _journal(
        conn,
        "reconcile",
        target,
        actor,
        {"happened": True, "result": stored.outcome, "batch_complete": stored.batch_complete},
    )
    return change


# -- journal ----------------------------------------------------------------------------


def tail(
    conn: psycopg.Connection[Any],
    *,
    run: str | None = None,
    limit: int = 20,
    follow: bool = False,
    stop: threading.Event | None = None,
    poll_s: float = FOLLOW_POLL_S,
) -> Iterator[Row]:
    """The newest ``limit`` journal events (of one run, when given), oldest first; with
    ``follow``, then every new event as it commits until ``stop`` is set.

    Journal ids are taken at insert but commit in any order, so following by "id greater
    than the last one" would miss a slow transaction's events: each poll re-reads the last
    ``RESCAN_IDS`` ids and skips those already yielded. Between polls the read transaction
    is ended, so following never holds back vacuum.
    """
    run_id = resolve_run(conn, run)["id"] if run is not None else None
    stop = stop or threading.Event()
    seen: set[int] = set()
    high = 0
    for row in fetch_all(conn, Q.journal_tail, {"run_id": run_id, "limit": limit}):
        seen.add(row["id"])
        high = max(high, row["id"])
        yield row
    while follow and not stop.wait(poll_s):
        floor = max(0, high - RESCAN_IDS)
        rows = fetch_all(
            conn, Q.journal_after, {"after_id": floor, "run_id": run_id, "limit": 10_000}
        )
        if not conn.autocommit:
            conn.rollback()  # read-only: end the snapshot
        for row in rows:
            if row["id"] in seen:
                continue
            seen.add(row["id"])
            high = max(high, row["id"])
            yield row
        seen = {i for i in seen if i > high - RESCAN_IDS}


def prune(conn: psycopg.Connection[Any], older_than: timedelta, *, actor: str) -> int:
    """Delete journal events older than ``older_than`` (journaled as ``journal.pruned``).

    Goes through the SQL function ``prune_journal``, the only way past the journal's
    append-only trigger; only the schema owner (or a superuser) may run it.
    """
    if older_than <= timedelta(0):
        raise InvalidInput("prune needs a positive age", hint="e.g. --older-than 30d")
    try:
        row = fetch_one(
            conn,
            Q.prune_journal,
            {"older_than_s": older_than.total_seconds(), "actor": actor},
        )
    except psycopg.errors.InsufficientPrivilege as err:
        raise OutboxError(
            f"pruning the journal was refused: {err.diag.message_primary}",
            hint="run prune as the role that owns the outbox schema (it ran the migrations)",
        ) from err
    assert row is not None
    return int(row["removed"])
