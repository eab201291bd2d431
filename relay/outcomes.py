"""What the relay works on and what an attempt produced: ``Claimed`` rows and ``Outcome``s.

Executors (``relay.executors``, ``relay.inprocess``, ``relay.model_turns``) turn a ``Claimed`` row
into an ``Outcome``; only the worker's completer writes outcomes, fenced. The helpers below
name the outcome kinds every executor shares, so a timeout means the same for every tool.
"""

from __future__ import annotations

import dataclasses
import email.utils
import time
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from outbox import credentials, policy, registry, storable

Action = Literal[
    "result",
    "retry",
    "defer",
    "unknown",
    "deliver",
    "lost",
    "turn",
    "fail_run",
    "skip",
    "webhook",
]
RETRY_AFTER_MAX_S = 600.0  # the longest wait a Retry-After header may ask for
# HTTP statuses that say the request was not processed (a tool's or an MCP server's)
NOT_PROCESSED = frozenset({408, 429, 503})
# Answers of a gateway in front of the tool, not of the tool: the request may still be
# running behind it, so the next attempt waits for it to settle like after a timeout.
GATEWAY_ANSWERS = frozenset({502, 504})
NOT_REPEATED = (
    "the tool honours no idempotency key and offers no lookup, so it is not called again: "
    "check the tool and run `outbox reconcile TOOL_CALL --happened --result JSON` or "
    "`--not-happened`"
)


class Claimed(NamedTuple):
    """A claimed outbox row with what its executor needs: the claim query's columns, in its
    order (a tuple, so a claim of hundreds of rows costs little to build)."""

    id: int
    kind: str
    tenant_id: str
    thread_id: Any
    run_id: Any
    batch_id: int | None
    tool_call_ref: int | None
    correlation_id: str | None
    attempt: int  # the claim's number: its fencing token
    failures: int  # attempts charged so far (only effects that failed count)
    max_attempts: int
    payload: dict[str, Any] | None  # None for tool calls (see the claim query)
    lag_s: float
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments: Any = None
    idempotency_key: str | None = None
    idempotency_mode: str | None = None
    executor: str | None = None
    dispatched_attempt: int | None = None
    # seconds until an earlier attempt that may have reached the tool can no longer take
    # effect there (None: there is no such attempt); by the database's clock
    settle_wait_s: float | None = None
    # the tool answers 409 to a key in use and never acts on it (outbox.registry.ToolSpec)
    refuses_key_in_use: bool = False
    endpoint: str | None = None
    lookup_endpoint: str | None = None
    callable: str | None = None
    timeout_s: float | None = None
    credential_ref: str | None = None
    stop: dict[str, Any] | None = None  # why a tool call must not run (outbox.policy)
    credential: dict[str, Any] | None = None  # where its secret is (outbox.credentials)
    mcp: dict[str, Any] | None = None  # an MCP tool's server and name (relay.mcpclient)
    traceparent: str | None = None  # the trace context its run continues (outbox.trace_context)
    tracestate: str | None = None
    run_started_at: float | None = None  # seconds since the epoch, the database's clock
    model: str | None = None  # its run's
    # seconds until the call's deadline (by the database's clock, at the claim; None: its
    # tool has none): no attempt is sent after it, and unsent attempts before it are not
    # charged (``uncharged``)
    deadline_in_s: float | None = None
    approved_by: str | None = None  # a call that waited for approval: its reviewer
    approval_wait_s: float | None = None  # ...and how long it waited for the decision
    claimed_at_monotonic: float = 0.0  # the worker's clock, for the claim-to-start metric

    def context(self) -> dict[str, Any]:
        """The identities every log line and journal event about this row carries."""
        return {
            "tenant_id": self.tenant_id,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "batch_id": self.batch_id,
            "tool_call_ref": self.tool_call_ref,
            "tool_call_id": self.tool_call_id,
            "correlation_id": self.correlation_id,
            "attempt": self.attempt,
        }


@dataclass(frozen=True)
class Outcome:
    """What an attempt produced. ``result``: a terminal result (ok or error) to store;
    ``retry``: try again later (or quarantine when out of attempts), after ``delay_s`` when
    the tool or model asked for it (``Retry-After``), else after the relay's backoff;
    ``defer``: the effect never started (its model server asked everyone to wait), try again
    after ``delay_s`` with no attempt charged; ``unknown``: ambiguous
    and not safely repeatable; ``deliver``: a batch delivery to perform in the completion
    transaction; ``lost``: the lease was gone before the effect, nothing to write;
    ``turn``: a model response (a ``ModelTurnIn`` in ``output``) to record; ``fail_run``:
    end the run as failed (``model_error``); ``skip``: nothing to do but finish the row;
    ``webhook``: a webhook answered (``output``: its status code) or was dropped (``status``
    ``error``: its endpoint was removed), to record with the finished row.
    ``unsent``: the attempt certainly never reached the tool (refused connection, a status
    that says "not processed", a call that never started), so its dispatch mark is taken
    back and the next attempt is not ambiguous. ``answered``: the tool answered the attempt
    (a 5xx from the tool itself): its outcome is still ambiguous, but the request is over
    there, so the next attempt need not wait for it to settle (``relay.executors``)."""

    row: Claimed
    action: Action
    status: Literal["ok", "error"] | None = None
    output: Any = None
    error: str | None = None
    source: str = "relay"
    duration_s: float = 0.0
    started_at: float = 0.0  # when the effect started, seconds since the epoch (its span's)
    delay_s: float | None = None
    unsent: bool = False
    answered: bool = False
    # A model turn's server (its base URL) and what its call says about it, for the
    # server's circuit (``report_model_calls_v1``): "failed" (429, 5xx, a timeout, no
    # connection) or "answered" (reported only when its circuit was not clean).
    server: str | None = None
    circuit: Literal["failed", "answered"] | None = None
    compaction: dict[str, Any] | None = None  # a turn's summary to record (relay.compaction)
    # The model a model turn's call went to (a fallback's, a routing rule's: not always the
    # run's), for the metrics of the model that answered or failed.
    model: str | None = None
    # A failed model turn with a fallback after its server: its next attempt goes past that
    # server ("next": its attempts there are used up) or does while the server's circuit is
    # open ("if_open"). Such a retry is not backed off (Completer.apply_all).
    fallback: Literal["next", "if_open"] | None = None

    def __post_init__(self) -> None:
        # An error quotes what a tool or model sent (a body's start, an exception's text);
        # a NUL in it would have PostgreSQL refuse the whole completion, so it is shown
        # escaped. The outcome's output is never touched: the edges refuse what cannot be
        # stored (outbox.storable).
        if self.error is not None:
            object.__setattr__(self, "error", storable.printable(self.error))


def result(row: Claimed, output: Any, source: str = "relay") -> Outcome:
    return Outcome(row, "result", "ok", output, None, source)


def error_result(row: Claimed, error: str) -> Outcome:
    return Outcome(row, "result", "error", None, error)


def retry(
    row: Claimed, error: str, delay_s: float | None = None, *, unsent: bool = False
) -> Outcome:
    """Try again later (after ``delay_s`` when the tool or model asked); ``unsent`` when
    this attempt certainly never reached the tool."""
    return Outcome(row, "retry", error=error, delay_s=delay_s, unsent=unsent)


def retry_after_s(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (a number of seconds or an HTTP date),
    capped at ``RETRY_AFTER_MAX_S``; None when it asks nothing readable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(RETRY_AFTER_MAX_S, max(0.0, seconds))


def ambiguous(row: Claimed, error: str, *, answered: bool = False) -> Outcome:
    """An attempt whose effect may or may not have happened, per the tool's mode;
    ``answered``: the tool answered it (``Outcome``)."""
    if registry.idempotency(row.idempotency_mode).after_ambiguous == "unknown":
        return Outcome(row, "unknown", error=f"outcome unknown: {error}; {NOT_REPEATED}")
    return dataclasses.replace(retry(row, error), answered=answered)


NETWORK_EXECUTORS = ("http", "mcp")  # tools whose calls may have a deadline


def deadline_left_s(row: Claimed) -> float | None:
    """Seconds left until the call's deadline now (None: it has none): what the claim
    measured by the database's clock, less the time since the claim on this process's.
    Only tool calls over the network have one (``outbox.registry.ToolSpec`` refuses it for
    others)."""
    if row.deadline_in_s is None or row.kind != "tool_call":
        return None
    if row.executor not in NETWORK_EXECUTORS:
        return None
    return row.deadline_in_s - (time.monotonic() - row.claimed_at_monotonic)


def past_deadline(row: Claimed, where: str) -> Outcome | None:
    """The end of a call whose deadline has passed before this attempt was sent (None: it
    has time left, or no deadline): nothing is sent after a call's deadline. Never sent at
    all, it is an error result the model sees ("not executed", which is true); when an
    earlier attempt may have reached ``where``, its outcome is unknown, for an operator."""
    left = deadline_left_s(row)
    if left is None or left > 0:
        return None
    said = (
        f"the call's deadline passed (its tool's deadline_s after the model asked for it) "
        f"before attempt {row.attempt} could be sent to {where}"
    )
    if row.dispatched_attempt is None:
        return Outcome(
            row,
            "result",
            "error",
            None,
            f"not executed: {said}; no attempt reached it, so it was not called",
        )
    return Outcome(
        row,
        "unknown",
        error=f"outcome unknown: {said}, and attempt {row.dispatched_attempt} may have "
        f"reached it; {NOT_REPEATED}",
    )


def runs_in_chunks(row: Claimed) -> bool:
    """An in-process tool call that may run in a chunk (``relay.inprocess``): its tool
    honours idempotency keys, so it needs no dispatch mark written before the call."""
    return (
        row.kind == "tool_call"
        and row.executor == "python"
        and registry.idempotency(row.idempotency_mode).in_chunks
        and row.stop is None
    )


def stopped(row: Claimed) -> Outcome:
    """A claimed call that must not run (switched off, or not approved): its error result,
    saying why, for the model to see. Nothing was attempted, so nothing is charged."""
    assert row.stop is not None
    return Outcome(
        row, "result", "error", None, policy.stop_text(row.tool_name or "", row.stop), "system"
    )


# -- secrets ----------------------------------------------------------------------------


def secret_of(row: Claimed) -> credentials.Secret | None:
    """The secret the call's tool needs, minted for this call (``outbox.credentials``)."""
    if not row.credential_ref:
        return None
    return credentials.resolve(row.credential_ref, row.credential)


def redacted(outcome: Outcome, secret: credentials.Secret | None) -> Outcome:
    """The outcome with the call's secret, in every form ``credentials.forms`` knows, cut
    out of its result and error: a tool that echoes the credential it was sent (in an error
    body, a result, re-encoded or not) must not hand it to the model, the journal, the logs
    or the tables."""
    if secret is None or not secret.value:
        return outcome
    return dataclasses.replace(
        outcome,
        output=credentials.redact_value(outcome.output, secret.value),
        error=None if outcome.error is None else credentials.redact(outcome.error, secret.value),
    )
