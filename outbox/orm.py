"""Typed SQLAlchemy 2 models of the outbox schema, for reading and for the migration check.

The schema itself is written as SQL in ``alembic/versions`` (the only way it
changes); these models mirror it so that backends can query with the ORM and a test can prove, with
Alembic's ``compare_metadata``, that the two never drift apart. Tables live in the schema
``outbox`` by default; ``metadata_for(name)`` gives the same tables in another schema.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    Interval,
    MetaData,
    Numeric,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import constants

DEFAULT_SCHEMA = "outbox"
ACTIVE_RUN_STATUSES = constants.ACTIVE


class Base(DeclarativeBase):
    metadata = MetaData(schema=DEFAULT_SCHEMA)


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=text("now()"))


# A tenant's table has a primary key that ends with tenant_id, so the tables can be
# distributed by tenant (docs/scale.md); its rows keep the ORM identity of the id alone
# (``__mapper_args__``), which the database makes unique: ``session.get(Run, run_id)``.
def _pk() -> Any:
    return mapped_column(BigInteger, Identity(always=True), primary_key=True)


class Thread(Base):
    __tablename__ = "threads"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (Index("threads_created", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    title: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB)
    next_seq: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    created_at: Mapped[datetime] = _now()
    deleted_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="when the thread (a conversation) was deleted through the API: hidden from "
        "it, kept here",
    )
    erased_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="when the thread's content was erased (erase_thread_v1): messages, arguments, "
        "results and response items removed; metadata, counts and digests kept",
    )


class Run(Base):
    __tablename__ = "runs"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        ForeignKeyConstraint(
            ["thread_id", "tenant_id"],
            ["threads.id", "threads.tenant_id"],
            name="runs_thread_fk",
        ),
        # idempotency_key first, and runs_tenant_status partial on a predicate every row
        # meets but only a statement that says it proves: no index that starts with
        # tenant_id serves a lookup of runs by id or by thread: a plan made on a young table
        # would read every run of the tenant for one (docs/operations.md).
        UniqueConstraint("idempotency_key", "tenant_id", name="runs_tenant_idempotency_key"),
        UniqueConstraint("id", "thread_id", "tenant_id", name="runs_id_thread_tenant_key"),
        Index(
            "runs_one_active_per_thread",
            "thread_id",
            "tenant_id",
            unique=True,
            postgresql_where=text(
                "status IN (" + ", ".join(f"'{s}'" for s in ACTIVE_RUN_STATUSES) + ")"
            ),
        ),
        Index(
            "runs_tenant_status",
            "tenant_id",
            "status",
            "created_at",
            postgresql_where=text("created_at > '-infinity'"),
        ),
        Index("runs_thread", "thread_id"),
        # Partial like runs_tenant_status: only the console's list, which states the
        # predicate, may take it, never a lookup by id under row-level security.
        Index(
            "runs_tenant_created",
            "tenant_id",
            "created_at",
            "id",
            postgresql_where=text("created_at > '-infinity'"),
        ),
        Index(
            "runs_action_deadline",
            "action_deadline",
            postgresql_where=text("status = 'requires_action'"),
        ),
        Index("runs_agent_span_due", "ended_at", postgresql_where=text("agent_span_due")),
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    status: Mapped[str] = mapped_column(Text, server_default=text("'queued'"))
    model: Mapped[str] = mapped_column(Text)
    api: Mapped[str] = mapped_column(Text, server_default=text("'responses'"))
    base_url: Mapped[str | None] = mapped_column(Text)
    instructions: Mapped[str | None] = mapped_column(Text)
    tool_names: Mapped[list[str]] = mapped_column(ARRAY(Text))
    tool_pins: Mapped[dict[str, Any]] = mapped_column(
        JSONB,
        server_default=text("'{}'::jsonb"),
        comment="the tool versions the run was started with: "
        '{"name": {"tenant_id", "version"}}; a run without pins (started before 0017) uses '
        "the newest versions",
    )
    model_options: Mapped[dict[str, Any]] = mapped_column(
        JSONB,
        server_default=text("'{}'::jsonb"),
        comment="what the run passes to its model beside the history and the tools, on "
        "every turn, in the Responses API's terms (outbox/providers.py writes them per API; "
        "docs/models.md)",
    )
    step_count: Mapped[int] = mapped_column(Integer)
    max_steps: Mapped[int] = mapped_column(Integer)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger)
    tokens_used: Mapped[int] = mapped_column(BigInteger)
    loop_limit: Mapped[int] = mapped_column(Integer)
    action_timeout: Mapped[timedelta] = mapped_column(Interval)
    action_deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    idempotency_key: Mapped[str | None] = mapped_column(Text)
    correlation_id: Mapped[str] = mapped_column(Text)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_cost: Mapped[Decimal | None] = mapped_column(Numeric)
    cost: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    traceparent: Mapped[str | None] = mapped_column(
        Text,
        comment="the W3C traceparent the run continues (the span of the backend that started "
        "it); NULL: the run is a trace of its own, whose trace id is the run id",
    )
    tracestate: Mapped[str | None] = mapped_column(
        Text, comment="the W3C tracestate that came with traceparent"
    )
    route_version: Mapped[int | None] = mapped_column(
        Integer,
        comment="the version of its tenant's routing rules (model_routes) the run was started "
        "with; NULL: none, every turn goes to the run's model",
    )
    agent_span_due: Mapped[bool] = mapped_column(
        Boolean,
        server_default=text("false"),
        comment="the run ended and the trace exporter has not exported its spans yet (set "
        "by the runs_span_due trigger, cleared by the exporter after its export)",
    )
    spans_taken_until: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="a trace exporter is exporting the run's spans until then (its lease: "
        "another exporter takes the run after it)",
    )
    cancelled_by: Mapped[str | None] = mapped_column(
        Text,
        comment="who cancelled the run (the actor given to cancel_run_v1, else the session user)",
    )


class Message(Base):
    __tablename__ = "messages"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        ForeignKeyConstraint(
            ["thread_id", "tenant_id"],
            ["threads.id", "threads.tenant_id"],
            name="messages_thread_fk",
        ),
        ForeignKeyConstraint(
            ["tool_call_ref", "thread_id", "tenant_id"],
            ["tool_calls.id", "tool_calls.thread_id", "tool_calls.tenant_id"],
            name="messages_tool_call_fk",
            use_alter=True,
        ),
        UniqueConstraint("thread_id", "seq", "tenant_id", name="messages_thread_seq_key"),
        ForeignKeyConstraint(
            ["run_id", "thread_id", "tenant_id"],
            ["runs.id", "runs.thread_id", "runs.tenant_id"],
            name="messages_run_fk",
        ),
        UniqueConstraint("id", "thread_id", "tenant_id", name="messages_id_thread_key"),
        UniqueConstraint("tool_call_ref", "tenant_id", name="messages_one_per_tool_call"),
        Index("messages_run", "run_id", postgresql_where=text("run_id IS NOT NULL")),
        ForeignKeyConstraint(
            ["content_ref", "tenant_id"],
            ["payloads.digest", "payloads.tenant_id"],
            name="messages_content_ref_fk",
        ),
        Index(
            "messages_content_ref", "content_ref", postgresql_where=text("content_ref IS NOT NULL")
        ),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(Text)
    content: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    tool_call_ref: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _now()
    deleted_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="when the message was deleted through the API: hidden from it and from "
        "later replays, kept here",
    )
    reasoning: Mapped[list[Any] | None] = mapped_column(
        JSONB,
        comment="reasoning items a client's history gave right before this message, "
        "verbatim: replayed before it to a model of the Responses API, never read",
    )
    # a tool message's text over outbox.payload_inline_max bytes: its digest in payloads
    # (content is NULL then); read it with outbox.resolved_text_v1
    content_ref: Mapped[str | None] = mapped_column(Text)


class ModelTurn(Base):
    __tablename__ = "model_turns"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("run_id", "step_no", "tenant_id", name="model_turns_run_step_key"),
        ForeignKeyConstraint(
            ["run_id", "tenant_id"], ["runs.id", "runs.tenant_id"], name="model_turns_run_fk"
        ),
        ForeignKeyConstraint(
            ["message_id", "tenant_id"],
            ["messages.id", "messages.tenant_id"],
            name="model_turns_message_fk",
        ),
        Index("model_turns_message", "message_id"),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    step_no: Mapped[int] = mapped_column(Integer)
    message_id: Mapped[int] = mapped_column(BigInteger)
    response_id: Mapped[str | None] = mapped_column(Text)
    input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()
    cached_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    cost: Mapped[Decimal | None] = mapped_column(
        Numeric,
        comment="what the turn cost by model_prices when it was recorded; "
        "NULL: the model had no price",
    )
    model: Mapped[str | None] = mapped_column(
        Text,
        comment="the model that answered the turn (a fallback's or a route's, else the run's)",
    )
    base_url: Mapped[str | None] = mapped_column(
        Text, comment="the base URL of the server that answered the turn"
    )


class ToolBatch(Base):
    __tablename__ = "tool_batches"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("run_id", "step_no", "tenant_id", name="tool_batches_run_step_key"),
        ForeignKeyConstraint(
            ["run_id", "thread_id", "tenant_id"],
            ["runs.id", "runs.thread_id", "runs.tenant_id"],
            name="tool_batches_run_fk",
        ),
        ForeignKeyConstraint(
            ["message_id", "thread_id", "tenant_id"],
            ["messages.id", "messages.thread_id", "messages.tenant_id"],
            name="tool_batches_message_fk",
        ),
        Index(
            "tool_batches_complete",
            "completed_at",
            postgresql_where=text("status = 'complete'"),
        ),
        Index("tool_batches_message", "message_id"),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    step_no: Mapped[int] = mapped_column(Integer)
    message_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(Integer)
    pending: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ToolCall(Base):
    __tablename__ = "tool_calls"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("run_id", "tool_call_id", "tenant_id", name="tool_calls_run_call_key"),
        UniqueConstraint("batch_id", "position", "tenant_id", name="tool_calls_batch_position_key"),
        UniqueConstraint("id", "thread_id", "tenant_id", name="tool_calls_id_thread_key"),
        ForeignKeyConstraint(
            ["run_id", "thread_id", "tenant_id"],
            ["runs.id", "runs.thread_id", "runs.tenant_id"],
            name="tool_calls_run_fk",
        ),
        ForeignKeyConstraint(
            ["batch_id", "run_id", "tenant_id"],
            ["tool_batches.id", "tool_batches.run_id", "tool_batches.tenant_id"],
            name="tool_calls_batch_fk",
        ),
        # idempotency_key first: no index that starts with tenant_id serves a lookup by run.
        UniqueConstraint("idempotency_key", "tenant_id", name="tool_calls_idempotency_key"),
        ForeignKeyConstraint(
            ["message_id", "thread_id", "tenant_id"],
            ["messages.id", "messages.thread_id", "messages.tenant_id"],
            name="tool_calls_message_fk",
        ),
        # the key tool_results references (a result names its own call's batch and run);
        # batch_id first, so it also serves the lookups of a batch's calls
        UniqueConstraint("batch_id", "id", "run_id", "tenant_id", name="tool_calls_batch_call_key"),
        Index("tool_calls_message", "message_id"),
        ForeignKeyConstraint(
            ["arguments_ref", "tenant_id"],
            ["payloads.digest", "payloads.tenant_id"],
            name="tool_calls_arguments_ref_fk",
        ),
        Index(
            "tool_calls_arguments_ref",
            "arguments_ref",
            postgresql_where=text("arguments_ref IS NOT NULL"),
        ),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    batch_id: Mapped[int] = mapped_column(BigInteger)
    message_id: Mapped[int] = mapped_column(BigInteger)
    position: Mapped[int] = mapped_column(Integer)
    tool_call_id: Mapped[str] = mapped_column(Text)
    tool_name: Mapped[str] = mapped_column(Text)
    tool_version: Mapped[int | None] = mapped_column(Integer)
    arguments: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    arguments_raw: Mapped[str] = mapped_column(Text)
    arguments_hash: Mapped[str] = mapped_column(Text)
    executor: Mapped[str] = mapped_column(Text)
    idempotency_mode: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    dispatched_attempt: Mapped[int | None] = mapped_column(Integer)
    dispatched_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="when attempt dispatched_attempt was marked as possibly reaching the tool "
        "(now() of the database, just before the request was sent); NULL once the tool "
        "answered it",
    )
    gave_up_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="when the relay stopped waiting for attempt dispatched_attempt (a timeout or a "
        "broken connection): its request may still act at the tool until the later of "
        "dispatched_at + the tool's timeout_s and this, plus settle_s",
    )
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    # arguments over outbox.payload_inline_max bytes: their digest in payloads (arguments is
    # NULL and arguments_raw '' then); read them with outbox.resolved_text_v1 and
    # outbox.resolved_json_v1
    arguments_ref: Mapped[str | None] = mapped_column(Text)


class ToolResult(Base):
    __tablename__ = "tool_results"
    __mapper_args__ = {"primary_key": ["tool_call_ref"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        # One key for the call, its batch and its run: one check a result stored, and the
        # batch exists by the call's own key (tool_calls_batch_fk).
        ForeignKeyConstraint(
            ["batch_id", "tool_call_ref", "run_id", "tenant_id"],
            ["tool_calls.batch_id", "tool_calls.id", "tool_calls.run_id", "tool_calls.tenant_id"],
            name="tool_results_call_batch_fk",
        ),
        ForeignKeyConstraint(
            ["output_ref", "tenant_id"],
            ["payloads.digest", "payloads.tenant_id"],
            name="tool_results_output_ref_fk",
        ),
        Index(
            "tool_results_output_ref", "output_ref", postgresql_where=text("output_ref IS NOT NULL")
        ),
    )

    tool_call_ref: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    batch_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(Text)
    output: Mapped[Any | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    # an output over outbox.payload_inline_max bytes: its digest in payloads (output is NULL
    # then); read it with outbox.resolved_json_v1
    output_ref: Mapped[str | None] = mapped_column(Text)


class OrphanedResult(Base):
    __tablename__ = "orphaned_results"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        ForeignKeyConstraint(
            ["tool_call_ref", "tenant_id"],
            ["tool_calls.id", "tool_calls.tenant_id"],
            name="orphaned_results_call_fk",
        ),
        Index("orphaned_results_run", "run_id"),
        Index(
            "orphaned_results_call",
            "tool_call_ref",
            postgresql_where=text("tool_call_ref IS NOT NULL"),
        ),
        ForeignKeyConstraint(
            ["output_ref", "tenant_id"],
            ["payloads.digest", "payloads.tenant_id"],
            name="orphaned_results_output_ref_fk",
        ),
        Index(
            "orphaned_results_output_ref",
            "output_ref",
            postgresql_where=text("output_ref IS NOT NULL"),
        ),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    batch_id: Mapped[int | None] = mapped_column(BigInteger)
    tool_call_ref: Mapped[int | None] = mapped_column(BigInteger)
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    output: Mapped[Any | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()
    # an output over outbox.payload_inline_max bytes: its digest in payloads (output is NULL
    # then); read it with outbox.resolved_json_v1
    output_ref: Mapped[str | None] = mapped_column(Text)


class Payload(Base):
    """A body stored once per tenant by its digest: arguments, results and tool
    messages over ``outbox.payload_inline_max`` bytes; the rows that reference it hold the
    digest. Deleted by ``sweep_payloads_v1`` once nothing references it."""

    __tablename__ = "payloads"

    digest: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    bytes: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Submission(Base):
    __tablename__ = "submissions"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("batch_id", "tenant_id", name="submissions_one_per_batch"),
        ForeignKeyConstraint(
            ["run_id", "tenant_id"], ["runs.id", "runs.tenant_id"], name="submissions_run_fk"
        ),
        ForeignKeyConstraint(
            ["batch_id", "run_id", "tenant_id"],
            ["tool_batches.id", "tool_batches.run_id", "tool_batches.tenant_id"],
            name="submissions_batch_fk",
        ),
        Index("submissions_run", "run_id"),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    batch_id: Mapped[int] = mapped_column(BigInteger)
    outputs_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _now()


class OutboxRow(Base):
    __tablename__ = "outbox"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("dedup_key", "tenant_id", name="outbox_dedup_key"),
        Index("outbox_ready", "available_at", "id", postgresql_where=text("status = 'ready'")),
        Index(
            "outbox_ready_tenant",
            "tenant_id",
            "available_at",
            "id",
            postgresql_where=text("status = 'ready'"),
        ),
        Index("outbox_leased_tenant", "tenant_id", postgresql_where=text("status = 'leased'")),
        Index(
            "outbox_leased_tool",
            "tool_name",
            postgresql_where=text("status = 'leased' AND tool_name IS NOT NULL"),
        ),
        Index("outbox_leased", "lease_expires_at", postgresql_where=text("status = 'leased'")),
        Index("outbox_run", "run_id"),
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    dedup_key: Mapped[str] = mapped_column(Text)
    thread_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    run_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    batch_id: Mapped[int | None] = mapped_column(BigInteger)
    tool_call_ref: Mapped[int | None] = mapped_column(BigInteger)
    correlation_id: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    available_at: Mapped[datetime] = _now()
    attempts: Mapped[int] = mapped_column(
        Integer, comment="claims so far: the fencing token, bumped by every claim, never reused"
    )
    max_attempts: Mapped[int] = mapped_column(Integer)
    failures: Mapped[int] = mapped_column(
        Integer,
        comment="attempts whose effect failed by the tool or model; quarantined at max_attempts",
    )
    lost_leases: Mapped[int] = mapped_column(
        Integer,
        comment="claims that ended with no outcome (holder died, lease expired); "
        "no attempt charged",
    )
    lease_owner: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    tool_name: Mapped[str | None] = mapped_column(
        Text,
        comment="the tool of a tool_call row (its lane for per-tool limits); NULL for other kinds",
    )
    created_at: Mapped[datetime] = _now()


class Tool(Base):
    __tablename__ = "tools"

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    description: Mapped[str] = mapped_column(Text)
    json_schema: Mapped[dict[str, Any]] = mapped_column(JSONB)
    executor: Mapped[str] = mapped_column(Text)
    endpoint: Mapped[str | None] = mapped_column(Text)
    lookup_endpoint: Mapped[str | None] = mapped_column(Text)
    callable: Mapped[str | None] = mapped_column(Text)
    credential_ref: Mapped[str | None] = mapped_column(Text)
    timeout_s: Mapped[float] = mapped_column(Double)
    settle_s: Mapped[float] = mapped_column(
        Double,
        server_default=text("5"),
        comment="seconds after its timeout that a request the relay gave up on may still take "
        "effect at the tool: no lookup and no resend of its call before dispatch + timeout_s "
        "+ settle_s",
    )
    refuses_key_in_use: Mapped[bool] = mapped_column(
        Boolean,
        server_default=text("false"),
        comment="the tool answers 409 to a request whose Idempotency-Key belongs to a request it "
        "is still acting on, and never acts on it: after an ambiguous attempt the relay resends "
        "at once instead of waiting for the earlier request to settle",
    )
    max_attempts: Mapped[int] = mapped_column(Integer)
    deadline_s: Mapped[float | None] = mapped_column(
        Double,
        comment="seconds after a call of this tool was made by which an attempt of it must "
        "have been sent (NULL: none); unsent attempts before it are not charged against "
        "max_attempts",
    )
    idempotency_mode: Mapped[str] = mapped_column(Text)
    risk_tier: Mapped[str] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = _now()
    requires_approval: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    mcp_server: Mapped[str | None] = mapped_column(Text)
    mcp_tool: Mapped[str | None] = mapped_column(Text)
    annotations: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    model_result_cap: Mapped[int | None] = mapped_column(
        Integer,
        comment="the most bytes of a result of this tool the model is given: past it, the "
        "model sees its first part and a handle that read_result pages (NULL: the platform's "
        "default, 0: no cap); the stored result is whole",
    )


class McpServer(Base):
    """An MCP tool server (outbox.mcpservers): how the relay reaches it."""

    __tablename__ = "mcp_servers"

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True, server_default=text("'*'"))
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    transport: Mapped[str] = mapped_column(Text)
    url: Mapped[str | None] = mapped_column(Text)
    headers: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    command: Mapped[list[str] | None] = mapped_column(JSONB)
    env: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    credential_ref: Mapped[str | None] = mapped_column(Text)
    trusted: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    prefix: Mapped[str] = mapped_column(Text)
    timeout_s: Mapped[float] = mapped_column(Double, server_default=text("30"))
    settle_s: Mapped[float] = mapped_column(Double, server_default=text("5"))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("5"))
    max_concurrency: Mapped[int] = mapped_column(Integer, server_default=text("16"))
    deadline_s: Mapped[float | None] = mapped_column(
        Double, comment="the deadline_s of the tools this server lists (NULL: none)"
    )
    overrides: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    synced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()


class JournalEvent(Base):
    """Append-only events, partitioned by day of ``at``: the primary key
    holds the partition key, as a partitioned table's must."""

    __tablename__ = "journal"
    __mapper_args__ = {"primary_key": ["id", "at"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        Index("journal_run", "run_id", "id"),
        Index("journal_at", "at"),
        Index("journal_thread_events", "thread_id", postgresql_where=text("run_id IS NULL")),
        {
            "comment": "append-only events for every state change; partitioned by day of `at` "
            "(journal_YYYYMMDD, made ahead by journal_partitions_v1; journal_default catches the "
            "rest; journal_upto_YYYYMMDD holds what was journaled before 0036); pruned by "
            "prune_journal a day at a time",
            "postgresql_partition_by": "RANGE (at)",
        },
    )

    id: Mapped[int] = _pk()
    at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), primary_key=True, server_default=text("clock_timestamp()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    event: Mapped[str] = mapped_column(Text)
    thread_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    run_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    batch_id: Mapped[int | None] = mapped_column(BigInteger)
    tool_call_ref: Mapped[int | None] = mapped_column(BigInteger)
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    outbox_id: Mapped[int | None] = mapped_column(BigInteger)
    correlation_id: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int | None] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(Text)
    actor: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB)


class TenantBudget(Base):
    __tablename__ = "tenant_budgets"

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger)
    tokens_used: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = _now()
    max_cost: Mapped[Decimal | None] = mapped_column(Numeric)
    cost_used: Mapped[Decimal] = mapped_column(Numeric, server_default=text("0"))
    max_prompt_tokens: Mapped[int | None] = mapped_column(
        Integer,
        comment="the prompt budget of the tenant's runs that name none (NULL: the platform's)",
    )


class ModelPrice(Base):
    """The price of a model's tokens, for budgets in money."""

    __tablename__ = "model_prices"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "price per million tokens of each model (input, cached input: input's "
        "price when NULL, output), in the platform's currency: what budgets in money count"
    }

    model: Mapped[str] = mapped_column(Text, primary_key=True)
    input_per_mtok: Mapped[Decimal] = mapped_column(Numeric)
    cached_input_per_mtok: Mapped[Decimal | None] = mapped_column(Numeric)
    output_per_mtok: Mapped[Decimal] = mapped_column(Numeric)
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()


class ModelFallback(Base):
    """Where a model's turns go when its server fails them (``outbox.routing``)."""

    __tablename__ = "model_fallbacks"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "where a model's turns go once after_attempts attempts of a turn failed "
        "(429, 5xx, a timeout, no connection) or while its base URL's circuit is open: "
        "another model, base URL (NULL: the run's) or API (NULL: the run's); a fallback's "
        "own fallback makes a chain"
    }

    model: Mapped[str] = mapped_column(Text, primary_key=True)
    to_model: Mapped[str] = mapped_column(Text)
    to_base_url: Mapped[str | None] = mapped_column(Text)
    to_api: Mapped[str | None] = mapped_column(Text)
    after_attempts: Mapped[int] = mapped_column(Integer, server_default=text("2"))
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()


class ModelCatalogue(Base):
    """What a model can take: its context window and its most output tokens."""

    __tablename__ = "model_catalogue"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "what each model can take: its context window and the most output tokens "
        "it answers, in tokens; a run's prompt budget is the window minus the output unless "
        "the run, its tenant or the platform names one"
    }

    model: Mapped[str] = mapped_column(Text, primary_key=True)
    context_window: Mapped[int] = mapped_column(Integer)
    max_output_tokens: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()
    prompt_cache_key: Mapped[str] = mapped_column(
        Text,
        server_default=text("'derived'"),
        comment="the prompt_cache_key the model's requests carry: derived (the caller's, else "
        "one derived from the tenant and the thread), caller (only a caller's), never (none: "
        "for a server that refuses the field)",
    )


class ModelCircuit(Base):
    """The circuit of one model base URL, shared by every relay (``outbox.routing``)."""

    __tablename__ = "model_circuits"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "one circuit per model base URL, shared by every relay: open after "
        "open_after consecutive failures within window_s (turns then go to their "
        "fallback, or wait, without sending), half-open after cool_down_s (one probe is "
        "sent), closed by the probe's answer"
    }

    base_url: Mapped[str] = mapped_column(Text, primary_key=True)
    state: Mapped[str] = mapped_column(Text, server_default=text("'closed'"))
    failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    first_failure_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    opened_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    probe_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    open_after: Mapped[int] = mapped_column(Integer, server_default=text("5"))
    window_s: Mapped[float] = mapped_column(Double, server_default=text("10"))
    cool_down_s: Mapped[float] = mapped_column(Double, server_default=text("5"))
    probe_timeout_s: Mapped[float] = mapped_column(Double, server_default=text("150"))
    updated_at: Mapped[datetime] = _now()


class ModelRoute(Base):
    """A tenant's routing rules, one version per row (``outbox.routing``)."""

    __tablename__ = "model_routes"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "a tenant's routing rules, one row per version (never changed): the "
        "first rule that matches a step picks its model; a run keeps the version it "
        "started with (runs.route_version)"
    }

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    rules: Mapped[list[Any]] = mapped_column(JSONB)
    created_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    created_at: Mapped[datetime] = _now()


class Compaction(Base):
    """The summary of a thread's oldest messages that the model sees in their place."""

    __tablename__ = "compactions"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("run_id", "step_no", "tenant_id", name="compactions_one_per_step"),
        ForeignKeyConstraint(
            ["run_id", "thread_id", "tenant_id"],
            ["runs.id", "runs.thread_id", "runs.tenant_id"],
            name="compactions_run_fk",
            ondelete="CASCADE",
        ),
        Index("compactions_thread", "thread_id", "through_seq"),
        {
            "comment": "summaries of a thread's oldest messages (seq up to through_seq) that "
            "the model sees in their place; the messages themselves stay in the thread. One "
            "per (run, step): the turn that compacted records it with itself"
        },
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    step_no: Mapped[int] = mapped_column(Integer)
    through_seq: Mapped[int] = mapped_column(BigInteger)
    summary: Mapped[str] = mapped_column(Text)
    tokens_before: Mapped[int] = mapped_column(Integer)
    tokens_after: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    output_tokens: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    created_at: Mapped[datetime] = _now()


class PlatformLimits(Base):
    """Limits over every run (one row)."""

    __tablename__ = "platform_limits"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "limits over every run: max_steps caps any run's model turns, whatever "
        "it asked for"
    }

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    max_steps: Mapped[int | None] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()


class RunDefaults(Base):
    """The defaults of new runs (one row), for start_run_v1 and the writer API."""

    __tablename__ = "run_defaults"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "defaults of new runs, one row: start_run_v1 takes each one its caller "
        "(SQL or the Python writer API) leaves out (outbox platform defaults)"
    }

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    max_steps: Mapped[int] = mapped_column(Integer, server_default=text("20"))
    loop_limit: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    action_timeout_s: Mapped[float] = mapped_column(Double, server_default=text("600"))
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()
    max_prompt_tokens: Mapped[int | None] = mapped_column(
        Integer,
        comment="the prompt budget of a run that names none and whose tenant names none "
        "(NULL: the model's window minus its output)",
    )


class Lane(Base):
    """A limit on a tool (across tenants) or a tenant."""

    __tablename__ = "lanes"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "limits per tool and per tenant: calls in flight (max_concurrency) and, "
        "for a tool, calls started per second (rate, a token bucket of burst max(1, rate)); "
        "every claim that takes work of a lane updates its row, which is how other claims "
        "see it"
    }

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    rate: Mapped[float | None] = mapped_column(Double)
    tokens: Mapped[float] = mapped_column(Double, server_default=text("0"))
    refilled_at: Mapped[datetime] = _now()
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = _now()


class RiskPolicy(Base):
    """What a tenant's calls of a risk tier do when recorded."""

    __tablename__ = "risk_policies"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "per tenant and risk tier, what a tool call does when it is recorded: "
        "allow, approve (wait for a decision of one of approvers, empty: any operator, within "
        "approval_timeout) or deny; tenant '*' is the default"
    }

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    risk_tier: Mapped[str] = mapped_column(Text, primary_key=True)
    action: Mapped[str] = mapped_column(Text)
    approvers: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    approval_timeout: Mapped[timedelta] = mapped_column(
        Interval, server_default=text("'24:00:00'::interval")
    )
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()


class Approval(Base):
    """A tool call waiting for a decision, bound to its arguments' digest."""

    __tablename__ = "approvals"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("tool_call_ref", "tenant_id", name="approvals_one_per_call"),
        ForeignKeyConstraint(
            ["run_id", "tenant_id"], ["runs.id", "runs.tenant_id"], name="approvals_run_fk"
        ),
        ForeignKeyConstraint(
            ["tool_call_ref", "tenant_id"],
            ["tool_calls.id", "tool_calls.tenant_id"],
            name="approvals_call_fk",
        ),
        Index("approvals_pending", "deadline", postgresql_where=text("status = 'pending'")),
        Index("approvals_run", "run_id"),
        {
            "comment": "a tool call that waits for a decision: bound to the digest of its "
            "arguments, decided once (approved, denied, or expired at its deadline)"
        },
    )

    id: Mapped[int] = _pk()
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    batch_id: Mapped[int] = mapped_column(BigInteger)
    tool_call_ref: Mapped[int] = mapped_column(BigInteger)
    tool_call_id: Mapped[str] = mapped_column(Text)
    tool_name: Mapped[str] = mapped_column(Text)
    arguments_digest: Mapped[str] = mapped_column(Text)
    rule: Mapped[str] = mapped_column(Text)
    approvers: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    deadline: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(Text, server_default=text("'pending'"))
    decided_by: Mapped[str | None] = mapped_column(Text)
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class ToolSwitch(Base):
    """A tool switched off for a tenant or for every tenant ('*')."""

    __tablename__ = "tool_switches"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "tools switched off, for one tenant or every tenant ('*'): calls not yet "
        'dispatched are answered "tool disabled" instead of running'
    }

    tool_name: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    switched_by: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    switched_at: Mapped[datetime] = _now()


class TenantPause(Base):
    """A tenant whose work the relay does not claim."""

    __tablename__ = "tenant_pauses"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "tenants whose work the relay does not claim: effects in flight finish, "
        "nothing new starts"
    }

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    paused_by: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    paused_at: Mapped[datetime] = _now()


class TenantRole(Base):
    """A login role bound to one tenant."""

    __tablename__ = "tenant_roles"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "login roles bound to one tenant: a session of role_name acts for "
        "tenant_id only, whatever it sets (outbox tenants grant)"
    }

    role_name: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text)
    granted_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    granted_at: Mapped[datetime] = _now()


class Credential(Base):
    """A secret a tool call carries, kept by reference."""

    __tablename__ = "credentials"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "secrets tool calls carry, per tenant ('*': every tenant's default), by "
        "reference: an environment variable or a file the relay reads, or a value encrypted "
        "with a key only the relay holds; never the value itself"
    }

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    source: Mapped[str] = mapped_column(Text)
    reference: Mapped[str | None] = mapped_column(Text)
    ciphertext: Mapped[str | None] = mapped_column(Text)
    header: Mapped[str] = mapped_column(Text, server_default=text("'Authorization'"))
    scheme: Mapped[str] = mapped_column(Text, server_default=text("'Bearer'"))
    version: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ApiKey(Base):
    """An API key of ``outbox serve``: only its SHA-256 is kept."""

    __tablename__ = "api_keys"
    __table_args__ = (
        UniqueConstraint("key_hash", name="api_keys_hash_key"),
        {
            "comment": "API keys of outbox serve: each names one tenant; only the SHA-256 of "
            "a key is kept; a revoked key (revoked_at) is refused"
        },
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    tenant_id: Mapped[str] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    key_hash: Mapped[str] = mapped_column(Text)
    key_prefix: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ConsoleUser(Base):
    """A person who signs in to the console of ``outbox serve``: only the argon2 hash of the
    password is kept; failed sign-ins are counted and lock the account. A person with an
    ``oidc_subject`` signs in through the OpenID Connect provider (and needs no password)."""

    __tablename__ = "console_users"
    __table_args__ = (
        Index(
            "console_users_oidc_subject",
            "oidc_subject",
            unique=True,
            postgresql_where=text("oidc_subject IS NOT NULL"),
        ),
        {
            "comment": "people who sign in to the console of outbox serve: a role in one "
            "tenant, or operator of every tenant (*); only the argon2 hash of a password is "
            "kept; failed_attempts and locked_until count failed sign-ins and lock the account"
        },
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text)
    role: Mapped[str] = mapped_column(Text)
    password_hash: Mapped[str | None] = mapped_column(Text)
    failed_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    oidc_subject: Mapped[str | None] = mapped_column(
        Text,
        comment="the person's subject (sub) at the console's OpenID Connect provider, set by "
        "an operator; NULL: signs in with a password only",
    )


class ConsoleSession(Base):
    """A signed-in browser of the console: only the SHA-256 of its cookie token is kept."""

    __tablename__ = "console_sessions"
    __table_args__ = (
        ForeignKeyConstraint(
            ["user_name"],
            ["console_users.name"],
            name="console_sessions_user_name_fkey",
            ondelete="CASCADE",
        ),
        Index("console_sessions_user", "user_name"),
        {
            "comment": "signed-in sessions of the console: the SHA-256 of the cookie token, "
            "the CSRF token of its forms, when it expires"
        },
    )

    token_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    user_name: Mapped[str] = mapped_column(Text)
    tenant_id: Mapped[str] = mapped_column(Text)
    csrf_token: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Assistant(Base):
    """An assistant of the Assistants protocol."""

    __tablename__ = "assistants"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        {
            "comment": "assistants of the Assistants protocol (outbox serve): model, "
            "instructions and tools a run starts from"
        },
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    instructions: Mapped[str | None] = mapped_column(Text)
    tools: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, server_default=text("'{}'::jsonb")
    )
    created_at: Mapped[datetime] = _now()


class AssistantRun(Base):
    """What the Assistants protocol keeps of a run beside it."""

    __tablename__ = "assistant_runs"
    __mapper_args__ = {"primary_key": ["run_id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        ForeignKeyConstraint(
            ["run_id", "tenant_id"], ["runs.id", "runs.tenant_id"], name="assistant_runs_run_fk"
        ),
        ForeignKeyConstraint(
            ["assistant_id", "tenant_id"],
            ["assistants.id", "assistants.tenant_id"],
            name="assistant_runs_assistant_fk",
            ondelete="SET NULL (assistant_id)",  # a deleted assistant's runs stay
        ),
        {
            "comment": "the assistant, declared tools and metadata of a run started through "
            "outbox serve"
        },
    )

    run_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    assistant_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    tools: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, server_default=text("'{}'::jsonb")
    )


class WebhookEndpoint(Base):
    """Where a tenant's run events are POSTed, signed."""

    __tablename__ = "webhook_endpoints"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        Index("webhook_endpoints_tenant", "tenant_id", postgresql_where=text("removed_at IS NULL")),
        {
            "comment": "webhook endpoints per tenant: run events are POSTed there, signed "
            "(Standard Webhooks), through the outbox; the secret is encrypted with the "
            "relay's key"
        },
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    ciphertext: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    created_at: Mapped[datetime] = _now()
    rotated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    removed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookDelivery(Base):
    """One webhook event for one endpoint, delivered once."""

    __tablename__ = "webhook_deliveries"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_key", "tenant_id", name="webhook_deliveries_once"),
        ForeignKeyConstraint(
            ["endpoint_id", "tenant_id"],
            ["webhook_endpoints.id", "webhook_endpoints.tenant_id"],
            name="webhook_deliveries_endpoint_fk",
        ),
        Index("webhook_deliveries_run", "run_id"),
        {
            "comment": "one row per webhook event and endpoint (unique): when it was "
            "delivered and how"
        },
    )

    id: Mapped[int] = _pk()
    endpoint_id: Mapped[uuid.UUID] = mapped_column(UUID)
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    event: Mapped[str] = mapped_column(Text)
    event_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status_code: Mapped[int | None] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class Response(Base):
    """A response of the Responses protocol: a stretch of a run."""

    __tablename__ = "responses"
    __mapper_args__ = {"primary_key": ["id"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        ForeignKeyConstraint(
            ["run_id", "tenant_id"], ["runs.id", "runs.tenant_id"], name="responses_run_fk"
        ),
        ForeignKeyConstraint(
            ["thread_id", "tenant_id"],
            ["threads.id", "threads.tenant_id"],
            name="responses_thread_fk",
        ),
        ForeignKeyConstraint(
            ["previous_response_id", "tenant_id"],
            ["responses.id", "responses.tenant_id"],
            name="responses_previous_fk",
        ),
        Index("responses_run", "run_id", "output_from_seq"),
        Index("responses_thread", "thread_id", "created_at"),
        Index(
            "responses_previous",
            "previous_response_id",
            postgresql_where=text("previous_response_id IS NOT NULL"),
        ),
        {
            "comment": "responses of the Responses protocol (outbox serve): each a stretch "
            "of a run, with the input items the request gave"
        },
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    run_id: Mapped[uuid.UUID] = mapped_column(UUID)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    previous_response_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    in_conversation: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    output_from_seq: Mapped[int] = mapped_column(Integer)
    input: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    model: Mapped[str] = mapped_column(Text)
    instructions: Mapped[str | None] = mapped_column(Text)
    tools: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, server_default=text("'{}'::jsonb")
    )
    background: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    model_options: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    deleted_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="when the response was deleted through the API: hidden from it, kept here",
    )


class RetentionPolicy(Base):
    """How long a tenant's conversations stay in the hot tables."""

    __tablename__ = "retention_policies"
    __table_args__ = {  # noqa: RUF012 (SQLAlchemy's declarative attribute)
        "comment": "how long a tenant's conversations stay in the hot tables after their "
        "last activity ('*': every tenant without its own row; no row: kept forever), and "
        "whether they are then archived or deleted; archive_keep ('*' only): how long the "
        "archive keeps them"
    }

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    max_age: Mapped[timedelta] = mapped_column(Interval)
    mode: Mapped[str] = mapped_column(Text, server_default=text("'archive'"))
    archive_keep: Mapped[timedelta | None] = mapped_column(Interval)
    updated_by: Mapped[str] = mapped_column(Text, server_default=text("SESSION_USER"))
    updated_at: Mapped[datetime] = _now()


class ArchivedRun(Base):
    """A retained run with its rows as one document, partitioned by day."""

    __tablename__ = "archived_runs"
    __mapper_args__ = {"primary_key": ["id", "archived_at"]}  # noqa: RUF012 (SQLAlchemy's declarative attribute)
    __table_args__ = (
        Index("archived_runs_run", "run_id"),
        Index("archived_runs_thread", "thread_id"),
        {
            "comment": "runs retained by an archive policy, each with its rows as one JSON "
            "document (run_id NULL: the thread and its messages of no run); partitioned by day "
            "of archiving, a day dropped whole past the archive's keep",
            "postgresql_partition_by": "RANGE (archived_at)",
        },
    )

    id: Mapped[uuid.UUID] = mapped_column(
        UUID, primary_key=True, server_default=text("gen_random_uuid()")
    )
    archived_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), primary_key=True, server_default=text("now()")
    )
    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(UUID)
    run_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    status: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    correlation_id: Mapped[str | None] = mapped_column(Text)
    document: Mapped[dict[str, Any]] = mapped_column(JSONB)


def metadata_for(schema: str) -> MetaData:
    """The models' tables as they appear in ``schema`` (for migrations and comparisons)."""
    if schema == DEFAULT_SCHEMA:
        return Base.metadata
    copy = MetaData(schema=schema)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(copy, schema=schema)
    return copy
