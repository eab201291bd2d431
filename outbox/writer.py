"""The writer API: what a backend (or the relay) calls inside its own transaction.

Guarantee: every function here runs its statements on the connection you pass and never
commits, rolls back or opens a transaction of its own. Nothing is visible to anyone else
before *your* commit, and a rollback leaves no trace: no message, no intent, no outbox row.
Pass a psycopg 3 connection (inside a transaction) or a SQLAlchemy ``Session``/``Connection``
on the ``postgresql+psycopg`` driver; both reach the same code through the same DBAPI
connection. For asyncio, ``outbox.aio`` offers the backend's calls on an ``AsyncConnection``
or ``AsyncSession``: starting, cancelling and answering runs are one statement each, built
in ``outbox.calls`` and run by both, calling the SQL functions of ``sql/``.

Dedup is the database's job (docs/guarantees.md, invariant 2): repeats meet a unique constraint with
``ON CONFLICT DO NOTHING`` and the function returns what is already stored, so a redelivered
event or a retried request never raises ``IntegrityError`` at the caller. Writes that move
one run forward take that run's row lock first, so concurrent writers queue up instead of
interleaving.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from outbox import budgets, calls, constants, registry, statements, storable, tenancy

# A tenant's budget is part of the writer's face for backends and the CLI; it is defined in
# outbox.budgets, beside a run's other limits.
from outbox.budgets import money_text as money_text
from outbox.budgets import set_tenant_budget as set_tenant_budget
from outbox.budgets import tenant_budget_spent as tenant_budget_spent
from outbox.errors import NotFound
from outbox.schemas import (
    ModelTurnIn,
    NewMessage,
    StartRun,
    ToolCallIn,
    ToolResultIn,
    check_size,
)
from outbox.sql import queries
from outbox.statements import UNPREPARED, Row, fetch_all, fetch_one, pg

# A backend journals its own events in its transaction through the writer, as it writes the
# rest; the statement is outbox.statements's, shared by every module.
from outbox.statements import journal as journal

Q = queries("writer.sql")
RunRef = calls.RunRef  # what start_run returns (defined beside the calls both writers share)
ThreadRef = calls.ThreadRef
ACTIVE = constants.ACTIVE  # run statuses, defined in outbox.constants
ENDED = constants.ENDED


# -- threads ----------------------------------------------------------------------------


def create_thread(
    db: Any,
    tenant_id: str,
    *,
    title: str | None = None,
    metadata: dict[str, Any] | None = None,
    messages: list[NewMessage] | None = None,
) -> ThreadRef:
    """Create a thread, optionally with opening messages (system prompt, earlier turns).

    One call of ``create_thread_v1`` (sql/runs.sql); journals thread.created.
    """
    (row,) = run_call(db, calls.create_thread(tenant_id, title, metadata, messages))
    return ThreadRef(row["id"], tenant_id)


WHOLE = "outbox_whole_transaction"  # the connection's attribute while ``whole`` holds


@contextmanager
def whole(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """For the block, the caller rolls the connection's whole transaction back on any
    error it raises (``outbox serve``'s request transactions): a write's refusal need not
    leave the transaction usable, so the calls made in the block take no savepoint, two
    round trips fewer each. Its refusals are raised as ever."""
    setattr(conn, WHOLE, True)
    try:
        yield
    finally:
        setattr(conn, WHOLE, False)


def run_call(db: Any, call: calls.Call) -> list[Row]:
    """Run one call of ``outbox.calls`` on the caller's connection (never committing);
    a refusal of the SQL function is raised as our error, and a write's refusal is rolled
    back to the savepoint taken before it, so the caller's transaction stays usable
    (unless the caller rolls it all back anyway: ``whole``)."""
    conn = pg(db)
    savepoint = call.savepoint and not getattr(conn, WHOLE, False)
    if savepoint:
        conn.execute(calls.SAVEPOINT)
    try:
        if call.scope is not None:
            tenancy.scope(conn, call.scope)
        rows = fetch_all(conn, call.query, call.params)
    except psycopg.Error as err:
        if savepoint and not conn.closed:
            conn.execute(calls.ROLLBACK)
        raise calls.refusal(err) or err from err
    if savepoint:
        conn.execute(calls.RELEASE)
    return rows


def check_message(role: str, content: str | None) -> None:
    """The checks a message's text passes before it is stored, the error naming its role."""
    storable.check_text(f"{role} message", content)
    check_size(f"{role} message", content)


def append_message(
    conn: psycopg.Connection[Any],
    thread_id: uuid.UUID,
    tenant_id: str,
    role: str,
    content: str | None,
    *,
    run_id: uuid.UUID | None = None,
    tool_call_ref: int | None = None,
    reasoning: list[dict[str, Any]] | None = None,
) -> int:
    """Append a message at the thread's next position; returns its id. ``reasoning``: the
    Responses API reasoning items a client's history gave right before it, kept verbatim
    and replayed before it to a model of that API (never read)."""
    check_message(role, content)
    if reasoning:
        check_size(f"the reasoning before a {role} message", storable.dumps(reasoning, "reasoning"))
    seq = fetch_one(conn, Q.take_seqs, {"thread_id": thread_id, "n": 1})
    if seq is None:
        raise NotFound(f"thread {thread_id} does not exist")
    row = fetch_one(
        conn,
        Q.insert_message,
        {
            "tenant_id": tenant_id,
            "thread_id": thread_id,
            "seq": seq["first_seq"],
            "role": role,
            "content": content,
            "run_id": run_id,
            "tool_call_ref": tool_call_ref,
            "reasoning": Jsonb(reasoning) if reasoning else None,
        },
    )
    assert row is not None
    return int(row["id"])


def answer_calls(
    conn: psycopg.Connection[Any], batch_ids: list[int], why: str = "no result was recorded"
) -> int:
    """Append the tool message of every call of ``batch_ids`` that has none yet, in call
    order, from its stored result; how many. A call without a result is answered with
    what is known: ``not executed: why`` only when no attempt was ever made, ``outcome
    unknown: why ...`` when one may have reached the tool, ``no output: why ...`` for a
    client call. One statement however many batches and threads (``answer_calls`` in
    writer.sql)."""
    return conn.execute(Q.answer_calls, {"batch_ids": batch_ids, "why": why}).rowcount


# -- runs -------------------------------------------------------------------------------


def start_run(db: Any, request: StartRun) -> RunRef:
    """Start a run: the user message, the run and its first model turn, all or nothing.

    One call of ``start_run_v3`` (sql/runs.sql), the implementation backends
    without Python call too. The same ``idempotency_key`` with the same request again
    returns the existing run (``created=False``), also when two requests race; the key
    with another request (thread, message, model or tools) raises ``IdempotencyKeyReused``
    and changes nothing. A different turn while the thread has an active run raises
    ``ActiveRunExists`` naming that run; unknown tools raise ``NotFound``, a spent tenant
    budget ``BudgetExceeded``; your transaction stays usable. ``model_options``
    (``outbox.schemas.ModelOptions``, docs/models.md) are kept with a run this call
    creates and journaled with its ``run.created``; the model gets them on every turn.
    """
    run_id, created = begin_run(db, request)
    (row,) = run_call(db, calls.get_run(run_id, None))
    return calls.run_ref(row, created)


def begin_run(db: Any, request: StartRun) -> tuple[uuid.UUID, bool]:
    """``start_run`` without reading the run back: (its id, created?), for a caller that
    needs no more of it (``outbox serve``'s create: one statement fewer)."""
    (started,) = run_call(db, calls.start_run(request))
    return uuid.UUID(str(started["run_id"])), bool(started["created"])


def enqueue(
    conn: psycopg.Connection[Any],
    run: Row,
    kind: str,
    dedup_key: str,
    *,
    batch_id: int | None = None,
    tool_call_ref: int | None = None,
    tool_name: str | None = None,
    max_attempts: int = 5,
    payload: Row | None = None,
    held: bool = False,
) -> int | None:
    """Add an outbox row for ``run``; returns its id, or None when the dedup key exists.
    A tool call names its tool (``tool_name``): the lane its per-tool limit counts in. A
    ``held`` row waits until its approval is decided (``outbox.approvals``)."""
    row = fetch_one(
        conn,
        Q.insert_outbox,
        {
            "tenant_id": run["tenant_id"],
            "kind": kind,
            "dedup_key": dedup_key,
            "thread_id": run["thread_id"],
            "run_id": run["id"],
            "batch_id": batch_id,
            "tool_call_ref": tool_call_ref,
            "tool_name": tool_name,
            "correlation_id": run["correlation_id"],
            "max_attempts": max_attempts,
            "payload": Jsonb(payload or {}),
            "held": held,
        },
    )
    return None if row is None else int(row["id"])


def lock_runs_then_batches(
    conn: psycopg.Connection[Any], run_ids: list[uuid.UUID], batch_ids: list[int]
) -> None:
    """Lock runs, then batches, each in id order: the one lock order of every writer path,
    so two transactions that write the same runs queue up instead of deadlocking. A caller
    that moves many runs forward in one transaction (the relay's completer) takes every
    lock up front this way; the writer's functions then find them held."""
    conn.execute(Q.lock_runs, {"run_ids": run_ids})
    lock_batches(conn, batch_ids)


def lock_batches(conn: psycopg.Connection[Any], batch_ids: list[int]) -> None:
    """Lock batches in id order, their runs already locked (``lock_runs_then_batches``)."""
    conn.execute(Q.lock_batches, {"batch_ids": batch_ids})


def lock_runs_unless_held(
    conn: psycopg.Connection[Any], run_ids: list[uuid.UUID]
) -> set[uuid.UUID]:
    """Lock, in id order, those of ``run_ids`` that no other transaction holds, without
    waiting for the others; returns the ids of those held elsewhere (a run that no longer
    exists is not among them: whoever writes for it finds it gone)."""
    free = {r for (r,) in conn.execute(Q.lock_free_runs, {"run_ids": run_ids})}
    missing = [r for r in run_ids if r not in free]
    if not missing:
        return set()
    return {r for (r,) in conn.execute(Q.runs_that_exist, {"run_ids": missing})}


def lock_run(conn: psycopg.Connection[Any], run_id: uuid.UUID, tenant_id: str | None) -> Row:
    row = fetch_one(conn, Q.lock_run, {"run_id": run_id})
    if tenant_id is None:
        if row is None:
            raise NotFound(f"run {run_id} does not exist")
        return row
    return statements.owned(row, "run", run_id, tenant_id)


def get_run(db: Any, run_id: uuid.UUID, tenant_id: str | None = None) -> Row:
    """The run's row as a dict (``NotFound``/``WrongTenant`` when it is not yours)."""
    rows = run_call(db, calls.get_run(run_id, tenant_id))
    return calls.found_run(rows[0] if rows else None, run_id, tenant_id)


# -- model turns ------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnRecord:
    """What a recorded model turn produced; ``created`` is False for a repeat."""

    model_turn_id: int | None
    message_id: int | None
    batch_id: int | None
    tool_call_refs: list[int]
    run_status: str
    created: bool


def idempotency_key(run_id: uuid.UUID, tool_call_id: str) -> str:
    """The stable key of a tool-call intent: identical on every retry and every worker."""
    digest = hashlib.sha256(f"{run_id}:{tool_call_id}".encode()).hexdigest()
    return f"ob-{digest[:40]}"


def arguments_hash(name: str, arguments_raw: str) -> str:
    try:
        canonical = json.dumps(json.loads(arguments_raw), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):  # not JSON, or nested past Python's parser
        canonical = arguments_raw
    return hashlib.sha256(f"{name}\x00{canonical}".encode()).hexdigest()


def record_model_turn(db: Any, turn: ModelTurnIn) -> TurnRecord:
    """Record a model response: the assistant message, the batch of tool-call intents and
    their outbox rows, token usage and the run's new status, in the caller's transaction.

    Only one response is recorded per (run, step): a repeat returns the stored turn with
    ``created=False``. Calls to unknown or disabled tools, or with arguments that are not
    JSON or fail the tool's schema, are stored with an error result the model will see on
    the next turn; they never raise and never lose the turn.

    Each call is planned here (``registry.plan_call``: its tool as the run pinned it, its
    JSON Schema, the risk policy); one call of ``record_model_turns_v1``
    (sql/turns.sql) writes the rest in one round trip.
    """
    (record,) = record_model_turns(db, [turn])
    return record


def record_model_turns(
    db: Any, turns: list[ModelTurnIn], spans: list[dict[str, Any] | None] | None = None
) -> list[TurnRecord]:
    """``record_model_turn`` for many turns at once, their records in the same order (a
    relay's completer records every turn of its transaction this way): per tenant, a
    fixed few statements however many turns there are, one of them calling
    ``record_model_turns_v1`` with all its turns. A refusal of any turn (a missing run,
    another tenant's) raises and, as for one turn, leaves the transaction to the caller.
    ``spans``: each turn's attempt span as the relay timed it (``relay.spans.record``),
    kept in its journal event for the trace exporter."""
    conn = pg(db)
    for turn in turns:
        check_size("assistant message", turn.content)
    by_tenant: dict[str, list[int]] = {}
    for i, turn in enumerate(turns):
        by_tenant.setdefault(turn.tenant_id, []).append(i)
    rows: list[Row] = [{}] * len(turns)
    for tenant_id, positions in sorted(by_tenant.items()):
        # A transaction acts for one tenant at a time (enter_tenant_v1 refuses another).
        # Tenants in name order: each holds its tenant's budget row to the end, so two
        # completers taking tenants in opposite orders would deadlock.
        tenancy.scope(conn, tenant_id)
        mine = [turns[i] for i in positions]
        planned = _plan_calls(conn, tenant_id, mine)
        fields = [_turn_fields(turn) for turn in mine]
        if spans is not None:
            for field, i in zip(fields, positions, strict=True):
                if spans[i] is not None:
                    field["span"] = spans[i]
        params = {"turns": Jsonb(fields), "calls": Jsonb(planned)}
        try:
            recorded = fetch_all(conn, Q.record_model_turns, params)
        except psycopg.Error as err:
            raise calls.refusal(err) or err from err
        for i, row in zip(positions, recorded, strict=True):
            rows[i] = row
    return [_turn_record(conn, turn, row) for turn, row in zip(turns, rows, strict=True)]


def _turn_record(conn: psycopg.Connection[Any], turn: ModelTurnIn, row: Row) -> TurnRecord:
    record = TurnRecord(
        row["model_turn_id"],
        row["message_id"],
        row["batch_id"],
        [int(ref) for ref in row["tool_call_refs"]],
        row["run_status"],
        False,
    )
    if not row["created"]:
        return record
    if row["recent_batches"] is not None:
        period = _loop_period(row["recent_batches"], turn.step_no, row["loop_limit"])
        if period is not None:
            record = replace(record, run_status=_end_loop(conn, turn.run_id, period))
    return replace(record, created=True)


LOOP_PERIODS = 4  # the longest cycle of turns a loop is detected in (A, B, C, D, A, ...)


def _turn_fields(turn: ModelTurnIn) -> Row:
    fields = turn.model_dump(mode="json", exclude={"tool_calls"})
    return {**fields, "loop_periods": LOOP_PERIODS}


def _plan_calls(
    conn: psycopg.Connection[Any], tenant_id: str, turns: list[ModelTurnIn]
) -> list[list[Row]]:
    """How each call of each of a tenant's turns will run, as ``record_model_turns_v1``
    takes it: one read of the runs' tools, and one of the tools they name per set of pins
    (the versions a run pinned when it started: runs started alike share one). A run this
    tenant cannot see plans nothing: the function refuses it."""
    planned: list[list[Row]] = [[] for _ in turns]
    asking = [i for i, turn in enumerate(turns) if turn.tool_calls]
    if not asking:
        return planned
    run_ids = list({turns[i].run_id for i in asking})
    runs = {row["id"]: row for row in fetch_all(conn, Q.runs_tools, {"run_ids": run_ids})}
    by_pins: dict[str, list[int]] = {}
    for i in asking:
        run = runs.get(turns[i].run_id)
        if run is not None:
            by_pins.setdefault(json.dumps(run["tool_pins"], sort_keys=True), []).append(i)
    for group in by_pins.values():
        pins = runs[turns[group[0]].run_id]["tool_pins"]
        names = [call.name for i in group for call in turns[i].tool_calls]
        tools = registry.resolve(conn, tenant_id, names, pins)
        for i in group:
            tool_names = runs[turns[i].run_id]["tool_names"]
            planned[i] = [
                _plan_call(turns[i], call, tools, tool_names) for call in turns[i].tool_calls
            ]
    return planned


def _plan_call(
    turn: ModelTurnIn, call: ToolCallIn, tools: dict[str, Row], tool_names: list[str]
) -> Row:
    plan = registry.plan_call(call, tools.get(call.name), tool_names)
    decision, approval = plan.decision, plan.approval
    return {
        "tool_call_id": call.tool_call_id,
        "name": call.name,
        "version": plan.version,
        "arguments": plan.arguments,
        "arguments_raw": call.arguments,
        "arguments_hash": arguments_hash(call.name, call.arguments),
        "executor": plan.executor,
        "idempotency_mode": plan.idempotency_mode,
        "idempotency_key": idempotency_key(turn.run_id, call.tool_call_id),
        "status": _call_status(plan),
        "error": plan.error,
        "decision": decision and {"action": decision.action, "rule": decision.rule},
        "max_attempts": plan.max_attempts,
        "approval": approval
        and {
            "rule": approval.rule,
            "approvers": list(approval.approvers),
            "timeout_s": approval.timeout_s,
        },
    }


def _call_status(plan: registry.CallPlan) -> str:
    if plan.error is not None:
        return "failed"
    return "awaiting_approval" if plan.approval is not None else "pending"


def _loop_period(recent: list[Row], step_no: int, limit: int) -> int | None:
    """The period of the cycle the run's last turns (``recent``: newest first) went round
    ``limit`` times in a row (1: the same calls each turn; 2: A, B, A, B...), or None."""
    signatures: list[tuple[str, ...]] = []
    for expected, batch in zip(range(step_no, 0, -1), recent, strict=False):
        if batch["step_no"] != expected:  # a turn without tool calls breaks the cycle
            break
        signatures.append(tuple(batch["signature"]))
    return loop_period(signatures, limit)


def loop_period(newest_first: list[tuple[str, ...]], repeats: int) -> int | None:
    """The shortest period p (up to ``LOOP_PERIODS``) such that the newest ``p * repeats``
    turns are the same ``p`` turns over and over; None when there is none."""
    for period in range(1, LOOP_PERIODS + 1):
        window = newest_first[: period * repeats]
        if len(window) < period * repeats:
            return None
        if all(window[i] == window[i % period] for i in range(len(window))):
            return period
    return None


def _end_loop(conn: psycopg.Connection[Any], run_id: uuid.UUID, period: int) -> str:
    """Fail a run that went round a loop (its lock is held); its new status."""
    run = lock_run(conn, run_id, None)
    if period == 1:
        error = (
            f"the model asked for the same tool calls with the same arguments "
            f"{run['loop_limit']} turns in a row"
        )
    else:
        error = (
            f"the model went round the same cycle of {period} turns of tool calls "
            f"{run['loop_limit']} times in a row"
        )
    return str(end_run(conn, run, "failed", "loop", error)["status"])


# -- tool results -----------------------------------------------------------------------


@dataclass(frozen=True)
class ResultRecord:
    """Where a result went: ``stored``, ``duplicate`` (already stored) or ``orphaned``."""

    outcome: str
    result: Row | None
    batch_complete: bool


def record_tool_result(db: Any, result: ToolResultIn) -> ResultRecord:
    """Store the one result of a tool call, in the caller's transaction.

    A repeat is a no-op that returns the stored result (``outcome="duplicate"``). A result
    for a batch that is already closed goes to ``orphaned_results`` and never into a
    context. When this result completes its batch, the batch's delivery is enqueued in the
    same transaction (exactly one result sees the batch complete: the batch row is locked).
    One call of ``record_tool_results_v1`` (sql/results.sql), the implementation
    the relay and ``submit_tool_outputs_v1`` use too, after the tenant's checks here.
    """
    conn = pg(db)
    tenancy.scope(conn, result.tenant_id)
    call = fetch_one(conn, Q.call_for_result, {"tool_call_ref": result.tool_call_ref})
    call = statements.owned(call, "tool call", result.tool_call_ref, result.tenant_id)
    recorded = record_tool_results(
        conn,
        [
            {
                "ref": call["id"],
                "status": result.status,
                "output": result.output,
                "error": result.error,
                "source": result.source,
                "attempt": result.attempt,
            }
        ],
        result.worker,
    )
    outcome, completed_batch = recorded[0][1], recorded[0][2]
    if outcome == "orphaned":
        return ResultRecord("orphaned", None, False)
    stored = fetch_one(conn, Q.get_result, {"tool_call_ref": call["id"]})
    return ResultRecord(outcome, stored, completed_batch is not None)


def record_tool_results(
    conn: psycopg.Connection[Any], results: list[Row], worker: str | None
) -> list[tuple[int, str, int | None]]:
    """Record many terminal results at once (``record_tool_results_v1``): each a dict of
    ``ref`` (the call's id), ``status``, ``output``, ``error``, ``source``, ``attempt`` and
    optionally ``lag_s``. Returns (ref, outcome, completed batch or None) per result, in
    order. The caller holds the runs' locks when it moves them forward (runs, then batches:
    the function locks the batches)."""
    rows = conn.execute(Q.record_tool_results, {"results": Jsonb(results), "worker": worker})
    return [(int(ref), str(outcome), batch) for ref, outcome, batch in rows.fetchall()]


# -- delivery ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """What delivering a batch did: ``delivered``, ``already`` (a repeat) or ``closed``."""

    outcome: str
    next_step: int | None
    run_status: str


def deliver_batch(db: Any, batch_id: int) -> Delivery:
    """Submit a complete batch's outputs: once, in the order the model asked for them.

    In one transaction (the caller's): the submission row (one per batch, by constraint),
    one tool message per call appended to the history in call order, the batch marked
    delivered, and the run's next model turn enqueued, unless a limit says the run must
    stop (``step_cap`` or ``budget``: the run fails with that reason, journaled). A repeat
    is a no-op; a batch that was closed (run cancelled or expired) delivers nothing.
    """
    return deliver_batches(db, [batch_id])[batch_id]


def deliver_batches(db: Any, batch_ids: list[int]) -> dict[int, Delivery]:
    """``deliver_batch`` for many batches at once, each with the same guarantees; the relay
    delivers every batch of a completion transaction with one call.

    A fixed number of statements however many batches (a run that must stop at a limit
    costs the statements of ``end_run``), so a delivery's cost is its tool messages, not
    round trips. Locks every run, then every batch, each in id order: the one lock order
    of every writer path.
    """
    conn = pg(db)
    owners = fetch_all(conn, Q.batch_owners, {"batch_ids": batch_ids})
    missing = set(batch_ids) - {o["id"] for o in owners}
    if missing:
        raise NotFound(f"batch {min(missing)} does not exist")
    run_ids = sorted({o["run_id"] for o in owners})
    runs = {r["id"]: r for r in fetch_all(conn, Q.lock_runs, {"run_ids": run_ids})}
    done: dict[int, Delivery] = {}
    complete: list[Row] = []
    for batch in fetch_all(conn, Q.lock_batches, {"batch_ids": sorted(set(batch_ids))}):
        run_status = runs[batch["run_id"]]["status"]
        if batch["status"] == "complete":
            complete.append(batch)
        elif batch["status"] == "delivered":
            done[batch["id"]] = Delivery("already", None, run_status)
        else:
            done[batch["id"]] = Delivery("closed", None, run_status)
    if complete:
        ids = [b["id"] for b in complete]
        submitted = {
            r["batch_id"] for r in fetch_all(conn, Q.insert_submissions, {"batch_ids": ids})
        }
        for batch in complete:
            if batch["id"] not in submitted:  # a concurrent delivery won; the lock serialised us
                done[batch["id"]] = Delivery("already", None, runs[batch["run_id"]]["status"])
        done.update(_deliver(conn, [b for b in complete if b["id"] in submitted], runs))
    return done


def _deliver(
    conn: psycopg.Connection[Any], batches: list[Row], runs: dict[Any, Row]
) -> dict[int, Delivery]:
    """The submitted ``batches``: their tool messages, delivered, and each run's next step."""
    if not batches:
        return {}
    ids = [b["id"] for b in batches]
    answer_calls(conn, ids)
    conn.execute(Q.mark_delivered, {"batch_ids": ids}, prepare=UNPREPARED)
    spent = budgets.tenant_budgets_spent(conn, sorted({b["tenant_id"] for b in batches}))
    ceiling = budgets.platform_max_steps(conn)
    done: dict[int, Delivery] = {}
    going_on: list[tuple[Row, int]] = []
    for batch in batches:
        run = runs[batch["run_id"]]
        if run["status"] in ENDED:
            done[batch["id"]] = Delivery("delivered", None, run["status"])
            continue
        next_step = batch["step_no"] + 1
        reason = budgets.limit_reached(run, next_step, spent.get(run["tenant_id"]), ceiling)
        if reason is not None:
            failed = end_run(conn, run, "failed", reason[0], reason[1])
            done[batch["id"]] = Delivery("delivered", None, failed["status"])
        else:
            going_on.append((batch, next_step))
    if going_on:
        moved = fetch_all(
            conn,
            Q.next_model_turns,
            {"run_ids": [b["run_id"] for b, _ in going_on], "steps": [n for _, n in going_on]},
            prepare=UNPREPARED,
        )
        status = {r["id"]: r["status"] for r in moved}
        for batch, next_step in going_on:
            done[batch["id"]] = Delivery("delivered", next_step, status[batch["run_id"]])
    return done


def end_run(
    conn: psycopg.Connection[Any],
    run: Row,
    status: str,
    reason: str,
    error: str | None = None,
    *,
    actor: str | None = None,
) -> Row:
    """End ``run`` (``failed``, ``cancelled`` or ``expired``) and keep its thread replayable.

    One call of ``end_run_v1`` (sql/runs.sql), the one implementation that
    ``cancel_run_v1`` uses too. The caller holds the run lock. Rows nobody holds a lease on
    are removed (no new claims); every batch whose outputs did not reach the history is
    closed, and each of its calls gets a tool message right away: its result if it has one,
    else an explicit error that claims no more than is known (a call that may have reached
    its tool is answered "outcome unknown", never "not executed"). Work still in flight
    finishes, its results land in ``orphaned_results``, and it is never started again.
    Returns the run's new row.
    """
    row = fetch_one(
        conn,
        calls.A.end_run,
        {"run_id": run["id"], "status": status, "reason": reason, "error": error, "actor": actor},
    )
    assert row is not None
    return row
