"""Errors that name what was wrong and what to do about it.

Every error the library raises to a backend or an operator is an ``OutboxError`` with a
``hint``: the CLI prints both, and nothing is lost when one is raised (the caller's
transaction decides what happens to its writes).
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base class: ``str(err)`` says what was wrong, ``err.hint`` what to do."""

    hint: str = ""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message} (hint: {self.hint})" if self.hint else message


class DatabaseUnavailable(OutboxError):
    """The database could not be reached or refused us."""


class DatabaseConfigError(DatabaseUnavailable):
    """The database settings are wrong: a URL that is not one, a password, user or database
    the server refuses. Unlike an unreachable server, waiting will not mend it."""


class MigrationsBehind(OutboxError):
    """The database schema is older than this code."""

    hint = "run `outbox db upgrade`"


class NotFound(OutboxError):
    """A thread, run, tool call or tool does not exist (for this tenant)."""


class WrongTenant(OutboxError):
    """The object exists but belongs to another tenant."""

    hint = "pass the tenant that owns the object"


class InvalidInput(OutboxError):
    """Input failed validation at the boundary (ids, JSON, sizes, schemas)."""


class PayloadTooLarge(InvalidInput):
    """A message, argument or result is over the configured size cap."""


class ActiveRunExists(OutboxError):
    """The thread already has a run that is queued, in progress or waiting for outputs."""

    def __init__(self, thread_id: object, run_id: object, status: str) -> None:
        super().__init__(
            f"thread {thread_id} already has active run {run_id} ({status})",
            hint=f"wait for run {run_id} to finish, cancel it (`outbox runs cancel {run_id}`), "
            "or resend this turn with the same idempotency key",
        )
        self.thread_id = thread_id
        self.run_id = run_id
        self.status = status


class IdempotencyKeyReused(OutboxError):
    """The same idempotency key was sent with a different request."""


class BudgetExceeded(OutboxError):
    """A tenant's token budget is spent: no new model turns until it is raised."""


class InvalidTransition(OutboxError):
    """The requested state change does not make sense from the current state."""


class NotPermitted(OutboxError):
    """The actor may not do this (for example: not one of an approval's approvers)."""


class NeedsTransaction(OutboxError):
    """The writer was handed a connection that is not inside a transaction."""

    hint = (
        "open a transaction first (`with conn.transaction():` or a non-autocommit "
        "connection); the writer never commits on your behalf"
    )
