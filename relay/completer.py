"""Completers: write the outcomes of effects, many per transaction, each write fenced.

A relay process runs a few completer threads (``--db-connections`` less the other links),
each with its own link and queue; a run's outcomes always go to the same completer, so
completers of one process never wait for each other's run and batch locks. Each takes
what is queued (up to ``completion_batch``) and writes it in one transaction:

- every write that completes a row is fenced on (lease holder, attempt): a refused write is
  journaled (``write.fenced``) and a tool result it carried is kept in
  ``orphaned_results``, never applied;
- locks are taken in one global order (runs, then batches, then rows by id), so
  completers, cancels and client submissions queue up instead of deadlocking;
- terminal tool results and batch deliveries take set-based paths
  (``writer.record_tool_results``, one call of ``record_tool_results_v1`` for every result,
  and ``writer.deliver_batches``): a fixed number of statements however many there are;
  model turns are recorded together through ``writer.record_model_turns``, the code
  backends call (one call of ``record_model_turns_v1`` writes every turn);
- a failed attempt is retried after exponential backoff with jitter (or what the tool or
  model asked with ``Retry-After``) while ``failures`` stays under ``max_attempts``, then
  quarantined; a model turn whose next attempt goes to its fallback is retried at once; a
  deferred one (never started) is put back uncharged, and so is a tool call whose attempt
  never reached the tool when the call has a deadline (``uncharged``): a retry is
  never due after the call's deadline.

When the database goes away the outcomes are kept and written once it is back (if the
leases expired meanwhile the fence refuses them, as it should). When it refuses a
transaction for what it held (``outbox.db.refused``: a NUL in jsonb, nesting past its
stack depth), that is no outage: each outcome is written alone, and one refused again is
written as what it means (a tool result as an error result, a model turn as its run's
failure), since its effect is done and its answer arrived. An outcome that cannot be
written at all (a bug) is logged and left to lease expiry.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from prometheus_client import Gauge
from psycopg.types.json import Jsonb

from outbox import constants, context, db, failpoints, statements, writer
from outbox.logs import log
from outbox.relay import spans
from outbox.relay.config import RelayConfig
from outbox.relay.links import Link, refusal
from outbox.relay.metrics import Metrics
from outbox.relay.outcomes import Claimed, Outcome, deadline_left_s, error_result
from outbox.schemas import ModelTurnIn
from outbox.sql import Queries

logger = logging.getLogger("relay.completer")
# What a written outcome (``apply``) says about its run's end: the run's status then.
RUN_ENDED_BY = {
    "recorded_completed": "completed",
    "recorded_failed": "failed",
    "recorded_cancelled": "cancelled",
    "recorded_expired": "expired",
    "run_failed": "failed",
}


class Completer:
    """Writes outcomes for one worker; ``loop(queue)`` is a completer thread's body.

    ``make_link(name)`` opens a link of the worker; ``written(outcomes)`` is told of rows
    whose outcome is written (or abandoned), so the worker frees their claim capacity;
    ``finished`` is set when the worker is done and the loops may end.
    """

    def __init__(
        self,
        cfg: RelayConfig,
        q: Queries,
        metrics: Metrics,
        make_link: Callable[[str], Link],
        written: Callable[[list[Outcome]], None],
        finished: threading.Event,
    ) -> None:
        self.cfg = cfg
        self.q = q
        self.metrics = metrics
        self.make_link = make_link
        self.written = written
        self.finished = finished

    def new_link(self) -> Link:
        """A completer's connection: it prepares its statements, on generic plans (Link)."""
        return self.make_link("complete")

    def loop(self, outcomes: queue.Queue[Outcome]) -> None:
        link = self.new_link()
        pending: list[Outcome] = []
        held = Held(self.metrics.outcomes_held)  # outcomes whose runs are held elsewhere
        while True:
            if not pending:
                try:
                    pending.append(outcomes.get(timeout=held.wait_s(0.1)))
                except queue.Empty:
                    if self.finished.is_set():
                        held.abandon(outcomes)
                        break
                    if not held.due():
                        continue
            pending.extend(held.take_if_due())
            while len(pending) < self.cfg.completion_batch:
                try:
                    pending.append(outcomes.get_nowait())
                except queue.Empty:
                    break
            try:
                again = self.write(link, pending)
                link.ok()
            except Exception as err:
                if link.outage(err):
                    if self.finished.is_set():  # shutting down, unreachable: leave to rescue
                        log(logger, logging.WARNING, "complete.abandoned", n=len(pending))
                        for _ in pending:
                            outcomes.task_done()
                        break
                    # The database went away: keep the outcomes and write them once it is
                    # back (if our leases expired meanwhile, the fence refuses them).
                    time.sleep(link.failed(err))
                    continue
                # Refused data or a bug, not an outage (the connection is fine): one bad
                # outcome must not stop the others being written.
                log(logger, logging.ERROR, "complete.batch_failed", error=repr(err), n=len(pending))
                again = [o for outcome in pending for o in self._write_alone(link, outcome)]
            for _ in range(len(pending) - len(again)):
                outcomes.task_done()
            held.keep(again)
            pending = []
        link.close()

    def write(self, link: Link, outcomes: list[Outcome]) -> list[Outcome]:
        """Write ``outcomes`` in one transaction, but those whose run another transaction
        holds: they are returned, not written, for a later round. The completer writes the
        outcomes of many runs of every tenant at once, and one run held by a transaction
        left open (an application's, a paused process's) must not hold the others back,
        nor the completer: its runs are locked with SKIP LOCKED, the batches then wait as
        in every writer path."""
        # One lock order for every completer in every process (batch, then row), so two
        # transactions completing calls of the same batches queue up instead of deadlocking.
        outcomes.sort(key=lambda o: (o.row.batch_id or 0, o.row.id))
        run_ids = sorted({o.row.run_id for o in outcomes if o.row.run_id is not None})
        conn = link.get()
        with conn.transaction():
            held = writer.lock_runs_unless_held(conn, run_ids)
            now = [o for o in outcomes if o.row.run_id not in held]
            applied = self.apply_all(conn, now, runs_locked=True) if now else []
            failpoints.hit("complete.before_commit")
        failpoints.hit("complete.after_commit")
        self._after_commit(now, applied)
        return [o for o in outcomes if o.row.run_id in held]

    def apply_all(
        self, conn: psycopg.Connection[Any], outcomes: list[Outcome], *, runs_locked: bool = False
    ) -> list[str]:
        """Write sorted outcomes in the completer's transaction; what happened to each.

        First the runs (unless ``runs_locked``: the caller did), then the batches of the
        whole transaction are locked, each in id order: the one lock order of every writer
        path (run before batch), so completers, cancels and client submissions queue up
        instead of deadlocking. Terminal tool results, batch deliveries and model turns then
        take set-based paths, a fixed number of statements however many there are: their
        rows are fenced together (lease holder and attempt per row);
        ``writer.record_tool_results`` stores them with one call of
        ``record_tool_results_v1``, the function every path records results with (it also
        enqueues, once, and journals the delivery of each batch they complete);
        ``writer.deliver_batches`` delivers every batch at once;
        ``writer.record_model_turns`` records every turn in one statement. Fenced rows and
        every other action go through ``_apply``, which journals a refused write.
        """
        results = [i for i, o in enumerate(outcomes) if o.action == "result"]
        deliveries = [i for i, o in enumerate(outcomes) if o.action == "deliver"]
        turns = [i for i, o in enumerate(outcomes) if o.action == "turn"]
        run_ids = sorted({o.row.run_id for o in outcomes if o.row.run_id is not None})
        batch_ids = sorted({o.row.batch_id for o in outcomes if o.row.batch_id is not None})
        if runs_locked:
            writer.lock_batches(conn, batch_ids)
        else:
            writer.lock_runs_then_batches(conn, run_ids, batch_ids)
        applied: list[str | None] = [None] * len(outcomes)
        for positions, kind, write_all in (
            (results, "tool_call", self._store_results),
            (deliveries, "deliver_batch", self._deliver),
            (turns, "model_turn", self._record_turns),
        ):
            if positions:
                self._set_based(conn, outcomes, positions, applied, kind, write_all)
        self._report_circuits(conn, [o for o in outcomes if o.circuit and o.server])
        outcomes = self._to_fallbacks_at_once(conn, outcomes)
        retries = [
            i for i, o in enumerate(outcomes) if applied[i] is None and _puts_back(o) is not None
        ]
        if retries:
            self._retry_many(conn, outcomes, retries, applied)
        return [
            what if what is not None else self.apply(conn, outcome)
            for outcome, what in zip(outcomes, applied, strict=True)
        ]

    def _to_fallbacks_at_once(
        self, conn: psycopg.Connection[Any], outcomes: list[Outcome]
    ) -> list[Outcome]:
        """A failed model turn whose next attempt goes to its fallback is retried at once:
        the backoff spares a failing server, and that attempt is not sent to it. Its
        attempts on the server are used up (``fallback == "next"``), or the server's circuit
        is open as this transaction's reports left it (``"if_open"``: one read, only when
        such a turn failed). A circuit that closes before the attempt is prepared sends it
        back to its server, which has just answered a probe."""
        if not any(o.action == "retry" and o.fallback for o in outcomes):
            return outcomes  # the common completion: nothing to look at again
        maybe = {
            o.server
            for o in outcomes
            if o.action == "retry" and o.fallback == "if_open" and o.server is not None
        }
        opened = (
            {r[0] for r in conn.execute(self.q.circuits_not_closed, {"base_urls": sorted(maybe)})}
            if maybe
            else set()
        )
        return [
            dataclasses.replace(o, delay_s=0.0)
            if o.action == "retry"
            and (o.fallback == "next" or (o.fallback == "if_open" and o.server in opened))
            else o
            for o in outcomes
        ]

    def _retry_many(
        self,
        conn: psycopg.Connection[Any],
        outcomes: list[Outcome],
        positions: list[int],
        applied: list[str | None],
    ) -> None:
        """Put the rows at ``positions`` back for a later attempt together
        (``retry_later_many``: fenced, dropped if their run is over, the calls' state and
        the journal in the one statement); ``applied`` stays None for a row fenced off,
        which ``apply`` journals."""
        chosen = [outcomes[i] for i in positions]
        delays = []
        charges = []
        for o in chosen:
            charge = _puts_back(o)
            assert charge is not None
            charges.append(charge)
            # An uncharged retry backs off by the attempts made: failures do not grow.
            step = o.row.attempt if uncharged(o) else o.row.failures + 1
            delays.append(o.delay_s if o.delay_s is not None else self._backoff(step))
        kept = self._fenced(
            conn,
            self.q.retry_later_many,
            chosen,
            {
                "errors": [o.error for o in chosen],
                "delays": delays,
                "charges": charges,
                "deadlines": [
                    o.row.deadline_in_s if deadline_left_s(o.row) is not None else None
                    for o in chosen
                ],
                "unsent": [o.unsent for o in chosen],
                "answered": [o.answered for o in chosen],
                "tool_call_ids": [o.row.tool_call_id for o in chosen],
                "details": [
                    Jsonb(
                        _with_span(
                            {"error": o.error, "delay_s": round(delay, 3)}
                            | ({"base_url": o.server} if o.server else {}),
                            o,
                        )
                    )
                    for o, delay in zip(chosen, delays, strict=True)
                ],
            },
        )
        for o, i in zip(chosen, positions, strict=True):
            if o.row.id in kept:
                applied[i] = "retry_scheduled"
            else:
                self._refused(conn, o)
                applied[i] = "fenced"
        self.metrics.retried.inc(len(kept))

    def _report_circuits(self, conn: psycopg.Connection[Any], outcomes: list[Outcome]) -> None:
        """Report what the model calls of this transaction said about their servers to
        their circuits (``report_model_calls_v1``: one statement, and none when every call
        was answered by a server whose circuit is clean), and journal each circuit this
        opened or closed with the run of a call that made it."""
        if not outcomes:
            return
        counts: dict[str, list[int]] = {}
        first: dict[str, Outcome] = {}
        for o in outcomes:
            assert o.server is not None
            failed, answered = counts.setdefault(o.server, [0, 0])
            counts[o.server] = [
                failed + (o.circuit == "failed"),
                answered + (o.circuit == "answered"),
            ]
            first.setdefault(o.server, o)
        urls = sorted(counts)
        changed = conn.execute(
            self.q.report_model_calls,
            {
                "base_urls": urls,
                "failed": [counts[u][0] for u in urls],
                "answered": [counts[u][1] for u in urls],
            },
        ).fetchall()
        for base_url, state, was, failures in changed:
            row = first[base_url].row
            self.metrics.circuit_changes.labels(state).inc()
            event = {"open": "opened", "closed": "closed"}.get(state, state)
            statements.journal(
                conn,
                f"model.circuit_{event}",
                row.tenant_id,
                **self._ids(row),
                detail={"base_url": base_url, "from": was, "failures": failures},
            )

    def _fence_many(
        self, conn: psycopg.Connection[Any], outcomes: list[Outcome], positions: list[int]
    ) -> list[tuple[Outcome, int]]:
        """Finish the rows at ``positions`` where this worker still holds their lease; the
        outcomes (and positions) that passed. The others are left to ``_apply``."""
        chosen = [outcomes[i] for i in positions]
        kept = self._fenced(conn, self.q.finish_many, chosen, {})
        return [(o, i) for o, i in zip(chosen, positions, strict=True) if o.row.id in kept]

    def _fenced(
        self,
        conn: psycopg.Connection[Any],
        query: str,
        chosen: list[Outcome],
        columns: dict[str, Any],
    ) -> set[int]:
        """Run a set-based statement fenced by lease holder and attempt (``finish_many``,
        ``retry_later_many``) over the rows of ``chosen``, with their other ``columns``;
        the ids of the rows it wrote (the others' leases are no longer this worker's)."""
        params = {
            "ids": [o.row.id for o in chosen],
            "attempts": [o.row.attempt for o in chosen],
            "worker": self.cfg.worker_id,
            **columns,
        }
        return {r[0] for r in conn.execute(query, params).fetchall()}

    def _set_based(
        self,
        conn: psycopg.Connection[Any],
        outcomes: list[Outcome],
        positions: list[int],
        applied: list[str | None],
        kind: str,
        write_all: Callable[[psycopg.Connection[Any], list[Outcome]], list[str]],
    ) -> None:
        """Fence the rows at ``positions`` together and write the outcomes that passed
        with ``write_all`` (what happened to each, in order); ``applied`` stays None for
        the rows whose lease this worker lost, which ``apply`` journals."""
        passed = self._fence_many(conn, outcomes, positions)
        if not passed:
            return
        written = write_all(conn, [o for o, _ in passed])
        for (_, i), what in zip(passed, written, strict=True):
            applied[i] = what
        self.metrics.succeeded.labels(kind).inc(len(passed))

    def _deliver(self, conn: psycopg.Connection[Any], outcomes: list[Outcome]) -> list[str]:
        """Deliver the batches of ``deliver`` rows at once (``writer.deliver_batches``)."""
        batch_ids = [o.row.batch_id for o in outcomes if o.row.batch_id is not None]
        delivered = writer.deliver_batches(conn, batch_ids)
        return ["delivered_" + delivered[b].outcome for b in batch_ids]

    def _record_turns(self, conn: psycopg.Connection[Any], outcomes: list[Outcome]) -> list[str]:
        """Record model turns together (``writer.record_model_turns``: one statement
        writes them all)."""
        records = writer.record_model_turns(
            conn, [o.output for o in outcomes], spans=[spans.record(o) for o in outcomes]
        )
        compacted = [o.compaction for o in outcomes if o.compaction is not None]
        if compacted:
            context.record_compactions(conn, compacted)
        return [f"recorded_{r.run_status}" if r.created else "already_recorded" for r in records]

    def _store_results(self, conn: psycopg.Connection[Any], outcomes: list[Outcome]) -> list[str]:
        """Store terminal tool results with one call of ``record_tool_results_v1``."""
        results = [
            _with_span(
                {
                    "ref": o.row.tool_call_ref,
                    "status": o.status,
                    "output": o.output,
                    "error": o.error,
                    "source": o.source,
                    "attempt": o.row.attempt,
                    "lag_s": round(max(0.0, o.row.lag_s), 4),
                },
                o,
            )
            for o in outcomes
        ]
        stored = {
            ref: what
            for ref, what, _ in writer.record_tool_results(conn, results, self.cfg.worker_id)
        }
        self.metrics.failed.inc(sum(1 for o in outcomes if o.status == "error"))
        return ["result_" + stored.get(o.row.tool_call_ref or 0, "duplicate") for o in outcomes]

    def _write_alone(self, link: Link, outcome: Outcome) -> list[Outcome]:
        """Write one outcome on its own; returns it if its run is held elsewhere (``write``).
        One the database refuses for its data (a result or a turn it cannot store) is
        written as what that means instead (``_instead``): the effect happened and its
        answer arrived, so waiting for its lease to run out would only have it performed
        again. If even that fails, the row is left to lease expiry."""
        try:
            return self.write(link, [outcome])
        except Exception as err:
            failure = err
        instead = _instead(outcome, failure) if db.refused(failure) else None
        if instead is not None:
            log(
                logger,
                logging.WARNING,
                "complete.refused",
                error=refusal(failure),
                **outcome.row.context(),
            )
            try:
                return self.write(link, [instead])
            except Exception as err:
                failure = err
        if link.outage(failure):
            link.failed(failure)
        log(logger, logging.ERROR, "complete.failed", error=repr(failure), **outcome.row.context())
        self.written([outcome])
        return []

    def _after_commit(self, outcomes: list[Outcome], applied: list[str]) -> None:
        self.written(outcomes)  # written rows free claim capacity
        info = logger.isEnabledFor(logging.INFO)  # asked once: thousands of outcomes a second
        observed = self.cfg.metrics_port is not None  # relay.metrics: only when served
        for outcome, what in zip(outcomes, applied, strict=True):
            row = outcome.row
            ended = RUN_ENDED_BY.get(what)
            if observed:
                self._observe(outcome, what, ended)
            level = (
                logging.WARNING if what in ("fenced", "quarantined", "unknown") else logging.INFO
            )
            if level == logging.INFO and not info:
                continue
            log(
                logger,
                level,
                f"{row.kind}.{what}",
                worker=self.cfg.worker_id,
                error=outcome.error,
                duration_s=round(outcome.duration_s, 4),
                **row.context(),
            )

    def _observe(self, outcome: Outcome, what: str, ended: str | None) -> None:
        """The latency, token and error metrics of a written outcome (``relay.metrics``)."""
        row, metrics = outcome.row, self.metrics
        tenant = metrics.tenant(row.tenant_id)
        said = spans.outcome_of(outcome)
        if row.kind == "tool_call":
            metrics.tool_call_seconds.labels(row.tool_name or "", tenant, said).observe(
                outcome.duration_s
            )
        elif row.kind == "model_turn" and outcome.action != "skip":
            model = outcome.model or row.model or ""  # the model that answered, or failed
            metrics.model_turn_seconds.labels(model, tenant, said).observe(outcome.duration_s)
            if what.startswith("recorded_") and isinstance(outcome.output, ModelTurnIn):
                turn = outcome.output
                metrics.tokens.labels(model, tenant, "input").inc(turn.input_tokens)
                metrics.tokens.labels(model, tenant, "output").inc(turn.output_tokens)
                metrics.tokens.labels(model, tenant, "cached_input").inc(turn.cached_tokens)
        if said in spans.ERRORS:
            metrics.errors.labels(row.kind, tenant, said).inc()
        if ended is not None and row.run_started_at is not None:
            metrics.run_seconds.labels(tenant, ended).observe(
                max(0.0, time.time() - row.run_started_at)
            )

    def _fence(
        self, conn: psycopg.Connection[Any], query: Any, outcome: Outcome, **extra: Any
    ) -> bool:
        row = outcome.row
        params = {"id": row.id, "worker": self.cfg.worker_id, "attempt": row.attempt, **extra}
        if conn.execute(query, params).fetchone() is not None:
            return True
        self._refused(conn, outcome)
        return False

    def _refused(self, conn: psycopg.Connection[Any], outcome: Outcome) -> None:
        """Journal a write the fence refused (the row's lease is another's, or its run is
        over and the row dropped); a result is kept as an orphan."""
        row = outcome.row
        self.metrics.fenced.inc()
        statements.journal(
            conn,
            "write.fenced",
            row.tenant_id,
            **self._ids(row),
            detail=_with_span(
                {"action": outcome.action, "status": outcome.status, "error": outcome.error},
                outcome,
            ),
        )
        if outcome.action == "result" and row.tool_call_ref is not None:
            conn.execute(
                self.q.insert_orphan,
                {
                    "tenant_id": row.tenant_id,
                    "run_id": row.run_id,
                    "batch_id": row.batch_id,
                    "tool_call_ref": row.tool_call_ref,
                    "tool_call_id": row.tool_call_id,
                    "status": outcome.status,
                    "output": Jsonb(outcome.output),
                    "error": outcome.error,
                    "reason": "fenced",
                    "source": outcome.source,
                    "attempt": row.attempt,
                },
            )

    def _ids(self, row: Claimed) -> dict[str, Any]:
        return {
            "thread_id": row.thread_id,
            "run_id": row.run_id,
            "batch_id": row.batch_id,
            "tool_call_ref": row.tool_call_ref,
            "tool_call_id": row.tool_call_id,
            "outbox_id": row.id,
            "correlation_id": row.correlation_id,
            "attempt": row.attempt,
            "worker": self.cfg.worker_id,
        }

    def apply(self, conn: psycopg.Connection[Any], outcome: Outcome) -> str:
        """Write one outcome inside the completer's transaction; returns what happened."""
        row = outcome.row
        if outcome.action == "lost":
            return "lost"
        if outcome.action in ("fail_run", "skip"):
            return self._apply_model(conn, outcome)
        if outcome.action == "webhook":
            return self._apply_webhook(conn, outcome)
        if outcome.action in ("result", "deliver", "turn"):
            # apply_all writes these set-based; a row here is one whose lease this worker
            # lost, refused by the fence (journaled, a result kept as an orphan).
            if not self._fence(conn, self.q.finish, outcome):
                return "fenced"
            write = {"result": self._store_results, "deliver": self._deliver}.get(
                outcome.action, self._record_turns
            )
            self.metrics.succeeded.labels(row.kind).inc()
            return write(conn, [outcome])[0]
        assert _puts_back(outcome) is None, "apply_all puts rows back (_retry_many)"
        reason = "outcome_unknown" if outcome.action == "unknown" else "max_attempts"
        if not self._fence(conn, self.q.quarantine, outcome, error=outcome.error):
            return "fenced"
        status = "outcome_unknown" if reason == "outcome_unknown" else "quarantined"
        self._call_status(conn, outcome, status)
        self.metrics.quarantined.labels(reason).inc()
        statements.journal(
            conn,
            f"{row.kind}.{status}",
            row.tenant_id,
            **self._ids(row),
            detail=_with_span({"error": outcome.error, "reason": reason}, outcome),
        )
        return "quarantined" if reason == "max_attempts" else "unknown"

    def _apply_model(self, conn: psycopg.Connection[Any], outcome: Outcome) -> str:
        """End a model turn's run (``fail_run``) or just finish its row (``skip``)."""
        if not self._fence(conn, self.q.finish, outcome):
            return "fenced"
        row = outcome.row
        self.metrics.succeeded.labels(row.kind).inc()
        if outcome.action == "skip":
            return "skipped"
        run = writer.lock_run(conn, row.run_id, None)
        if run["status"] in constants.ENDED:
            return "skipped"
        writer.end_run(conn, run, "failed", "model_error", outcome.error)
        span = spans.record(outcome)
        if span is not None:  # the failed turn's attempt, for its span (outbox.trace_export)
            statements.journal(
                conn,
                "model_turn.failed",
                row.tenant_id,
                **self._ids(row),
                detail={"span": span, "error": outcome.error},
            )
        return "run_failed"

    def _apply_webhook(self, conn: psycopg.Connection[Any], outcome: Outcome) -> str:
        """A webhook answered (delivered) or was dropped (its endpoint removed): finish the
        row and record it on its delivery."""
        if not self._fence(conn, self.q.finish, outcome):
            return "fenced"
        row = outcome.row
        assert row.payload is not None
        delivered = outcome.status == "ok"
        status_code = outcome.output["status_code"] if delivered else None
        conn.execute(
            self.q.webhook_done,
            {
                "delivery_id": row.payload["delivery_id"],
                "delivered": delivered,
                "status_code": status_code,
                "attempt": row.attempt,
            },
        )
        self.metrics.succeeded.labels(row.kind).inc()
        statements.journal(
            conn,
            "webhook.delivered" if delivered else "webhook.dropped",
            row.tenant_id,
            **self._ids(row),
            detail={
                "endpoint_id": row.payload["endpoint_id"],
                "event_key": row.payload["event_key"],
                "run_id": row.payload["body"]["data"]["id"],
                "status_code": status_code,
                "reason": outcome.error,
            },
        )
        return "webhook_delivered" if delivered else "webhook_dropped"

    def _call_status(self, conn: psycopg.Connection[Any], outcome: Outcome, status: str) -> None:
        """Record a call's state after an attempt: its dispatch mark taken back when the
        attempt never reached the tool, its dispatch time forgotten when the tool answered
        (the request is over there: nothing of it can act later)."""
        row = outcome.row
        if row.tool_call_ref is not None:
            conn.execute(
                self.q.call_status,
                {
                    "tool_call_ref": row.tool_call_ref,
                    "status": status,
                    "attempt": row.attempt,
                    "error": outcome.error,
                    "unsent": outcome.unsent,
                    "answered": outcome.answered,
                },
            )

    def _backoff(self, failures: int) -> float:
        """Exponential backoff with jitter after the ``failures``-th failed attempt: half
        the nominal delay, plus up to as much again."""
        nominal = float(min(self.cfg.retry_cap_s, self.cfg.retry_base_s * 2 ** (failures - 1)))
        return nominal / 2 + random.uniform(0, nominal / 2)


class Held:
    """A completer's outcomes whose runs another transaction holds (``Completer.write``):
    tried again after 10 ms, then twice as long each round they are still held, up to a
    second, while the completer writes everything else. Each is logged once when first
    held (``complete.run_held``), and the count every 30 s while any stays held."""

    FIRST_S = 0.01
    MOST_S = 1.0
    LOG_EVERY_S = 30.0

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge  # the outcomes held, of every completer of the process
        self.outcomes: list[Outcome] = []
        self.rounds = 0
        self.due_at = 0.0
        self.announced: set[int] = set()  # outbox ids logged as held
        self.logged_at = 0.0

    def keep(self, outcomes: list[Outcome]) -> None:
        """What the last round could not write: held again (or, with none, the rounds
        start over once nothing is held)."""
        if not outcomes:
            if not self.outcomes:
                self.rounds = 0
                self.announced.clear()
            return
        self.outcomes.extend(outcomes)
        self.gauge.inc(len(outcomes))
        self.rounds += 1
        now = time.monotonic()
        self.due_at = now + min(self.FIRST_S * 2 ** (self.rounds - 1), self.MOST_S)
        for outcome in outcomes:
            if outcome.row.id not in self.announced:
                self.announced.add(outcome.row.id)
                log(
                    logger,
                    logging.WARNING,
                    "complete.run_held",
                    **outcome.row.context(),
                    hint="another transaction holds this run's row (an application's "
                    "transaction left open?): its outcome is written once it lets go; "
                    "`outbox queue holders` names the holder",
                )
        if now - self.logged_at >= self.LOG_EVERY_S:
            self.logged_at = now
            log(logger, logging.WARNING, "complete.runs_held", n=len(self.outcomes))

    def due(self) -> bool:
        return bool(self.outcomes) and time.monotonic() >= self.due_at

    def take_if_due(self) -> list[Outcome]:
        if not self.due():
            return []
        taken, self.outcomes = self.outcomes, []
        self.gauge.dec(len(taken))
        return taken

    def wait_s(self, most_s: float) -> float:
        """How long the completer may wait for a new outcome before these are due."""
        if not self.outcomes:
            return most_s
        return max(0.0, min(most_s, self.due_at - time.monotonic()))

    def abandon(self, outcomes: queue.Queue[Outcome]) -> None:
        """At shutdown: leave them to the release or the rescue, as an outage does."""
        if self.outcomes:
            log(logger, logging.WARNING, "complete.abandoned", n=len(self.outcomes))
        for _ in self.outcomes:
            outcomes.task_done()
        self.gauge.dec(len(self.outcomes))
        self.outcomes = []


def _puts_back(outcome: Outcome) -> int | None:
    """For an outcome that puts its row back for a later attempt, its charge: 1 when the
    attempt counts against ``max_attempts``, 0 when it does not (a hold, a defer, an
    ``uncharged`` retry); None for any other outcome."""
    free = outcome.action == "defer" or uncharged(outcome)
    row = outcome.row
    if free or (outcome.action == "retry" and row.failures + 1 < row.max_attempts):
        return int(not free)
    return None


def uncharged(outcome: Outcome) -> bool:
    """Whether a retry is not charged against ``max_attempts``: its attempt certainly never
    reached the tool (``unsent``) and the call has a deadline, which bounds such retries
    instead (the attempt due at it sends nothing: ``relay.executors.past_deadline``).
    Without a deadline an unsent attempt is charged, so a tool that stays unreachable is
    not retried forever."""
    return outcome.action == "retry" and outcome.unsent and deadline_left_s(outcome.row) is not None


def _instead(outcome: Outcome, err: BaseException) -> Outcome | None:
    """What to write when the database refused ``outcome``'s data (``db.refused``): a
    tool result becomes an error result the model sees, a model turn fails its run (as a
    model answer that cannot be recorded does), both naming the refusal. None for any
    other outcome: its data is ours, and a refusal of it is a bug to look at."""
    said = f"PostgreSQL refused it: {refusal(err)}"
    if outcome.action == "result" and outcome.row.tool_call_ref is not None:
        return error_result(outcome.row, f"tool result could not be stored: {said}")
    if outcome.action == "turn":
        return Outcome(outcome.row, "fail_run", error=f"model answer could not be recorded: {said}")
    return None


def _with_span(detail: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """A journal event's detail (or a result as ``record_tool_results_v1`` journals it)
    with the attempt's span (``relay.spans.record``), if it has one: the trace exporter
    builds the span from it. Without one, it is as it was."""
    span = spans.record(outcome)
    if span is not None:
        detail["span"] = span
    return detail
