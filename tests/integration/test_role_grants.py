"""Each role can do what it is granted: every function a role may EXECUTE
is called as that role, on valid inputs, and must succeed.

A grant says nothing of the rights the function then needs: ``outbox_api`` was granted
``record_model_turn(s)_v1`` without the right to update ``tenant_budgets``, so every call
failed with 42501. The functions are the ones the catalog says each role may execute
(``has_function_privilege``), so a new grant without a call below fails here. The roles
are the ones the migrations create and a tenant's login role (``outbox tenants grant``),
which logs in as itself; the others are taken with ``SET LOCAL ROLE`` from the owner's
connection, as in test_roles_rls.py. Every call is rolled back: each starts from the seed.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from outbox import keys, limits, tenancy, writer
from tests.helpers import add_tool, new_run, turn

A = "tenant-a"
ROLES = ("outbox_writer", "outbox_relay", "outbox_api", "outbox_auditor")
LOGIN = "a tenant's login role"

# Every function of the schema a role may execute, as the catalog has it (trigger functions
# run only as triggers).
GRANTED = """
SELECT p.proname FROM pg_proc p
WHERE p.pronamespace = 'outbox'::regnamespace AND p.prorettype <> 'trigger'::regtype
  AND has_function_privilege(current_user, p.oid, 'EXECUTE')
ORDER BY 1
"""


@dataclass(frozen=True)
class Seed:
    """Committed by the owner: a run waiting for a client output beside a relay call (its
    batch open, its outbox row ready), a run whose call waits for approval, a queued run
    with no turn recorded, a limited lane, an API key."""

    waiting: writer.RunRef
    call_ref: int
    held: writer.RunRef
    approval_id: int
    queued: writer.RunRef
    key_hash: str


def seed(db_url: str) -> Seed:
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        add_tool(conn, "approve", executor="client", endpoint=None)
        add_tool(conn, "refund", requires_approval=True)
        writer.set_tenant_budget(conn, A, 10**9)
        limits.set_limits(conn, "tool", "lookup_order", max_concurrency=5, actor="test")
        waiting = new_run(conn, tenant=A, tools=["lookup_order", "approve"])
        recorded = writer.record_model_turn(
            conn,
            turn(
                waiting,
                1,
                ("k1", "lookup_order", {"order_id": "1"}),
                ("c1", "approve", {"order_id": "1"}),
            ),
        )
        held = new_run(conn, tenant=A, tools=["refund"])
        writer.record_model_turn(conn, turn(held, 1, ("r1", "refund", {"order_id": "2"})))
        approval = conn.execute(
            "SELECT id FROM outbox.approvals WHERE run_id = %s", [held.id]
        ).fetchone()
        queued = new_run(conn, tenant=A)
        _, key = keys.create_key(conn, A)
        conn.commit()
    assert recorded.run_status == "requires_action" and approval is not None
    return Seed(waiting, recorded.tool_call_refs[0], held, approval[0], queued, keys.digest(key))


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def turn_json(s: Seed) -> dict[str, Any]:
    return {
        "tenant_id": A,
        "run_id": str(s.queued.id),
        "step_no": 1,
        "content": "done",
        "response_id": "resp_1",
        "input_tokens": 10,
        "output_tokens": 5,
        "cached_tokens": 0,
    }


def result(s: Seed) -> dict[str, Any]:
    """A relay's result of the waiting run's call."""
    return {"ref": s.call_ref, "status": "ok", "output": {"id": 1}, "source": "relay", "attempt": 1}


def start_run(conn: psycopg.Connection[Any], s: Seed) -> None:
    thread = one(conn, "SELECT outbox.create_thread_v1(%s)", [A])
    status = one(
        conn,
        "SELECT status FROM outbox.start_run_v1(%s, %s, 'scripted', p_message => 'hi', "
        "p_tools => ARRAY['lookup_order'])",
        [A, thread],
    )
    assert status == "queued"


def start_run_traced(conn: psycopg.Connection[Any], s: Seed) -> None:
    thread = one(conn, "SELECT outbox.create_thread_v1(%s)", [A])
    status = one(
        conn,
        "SELECT status FROM outbox.start_run_v2(%s, %s, 'scripted', p_message => 'hi', "
        "p_traceparent => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', "
        "p_tracestate => 'vendor=1')",
        [A, thread],
    )
    assert status == "queued"


def start_run_with_options(conn: psycopg.Connection[Any], s: Seed) -> None:
    thread = one(conn, "SELECT outbox.create_thread_v1(%s)", [A])
    status = one(
        conn,
        "SELECT status FROM outbox.start_run_v3(%s, %s, 'scripted', p_message => 'hi', "
        "p_model_options => '{\"temperature\": 0}')",
        [A, thread],
    )
    assert status == "queued"


# A valid call of each function, and what it must answer.
Call = Callable[[psycopg.Connection[Any], Seed], None]
CALLS: dict[str, Call] = {
    "api_key_tenant_v1": lambda c, s: _is(
        one(c, "SELECT outbox.api_key_tenant_v1(%s)", [s.key_hash]), A
    ),
    "console_account_v1": lambda c, s: _is(
        one(c, "SELECT count(*) FROM outbox.console_account_v1('nobody')"), 0
    ),
    "console_oidc_signed_in_v1": lambda c, s: _is(
        one(
            c,
            "SELECT count(*) FROM outbox.console_oidc_signed_in_v1("
            "'nobody', repeat('0', 64), 'x', interval '1 hour')",
        ),
        0,
    ),
    "console_session_v1": lambda c, s: _is(
        one(c, "SELECT count(*) FROM outbox.console_session_v1(repeat('0', 64))"), 0
    ),
    "console_signed_in_v1": lambda c, s: _is(
        one(c, "SELECT outbox.console_signed_in_v1('nobody', NULL, 'x', interval '1 hour')"),
        False,
    ),
    "console_signed_out_v1": lambda c, s: one(
        c, "SELECT outbox.console_signed_out_v1(repeat('0', 64))"
    ),
    "cancel_run_v1": lambda c, s: _is(
        one(c, "SELECT status FROM outbox.cancel_run_v1(%s, %s)", [A, s.waiting.id]),
        "cancelled",
    ),
    "create_thread_v1": lambda c, s: _is_a(
        one(c, "SELECT outbox.create_thread_v1(%s, 'title')", [A]), uuid.UUID
    ),
    "current_tenant_v1": lambda c, s: _is(one(c, "SELECT outbox.current_tenant_v1()"), A),
    "decide_approval_v1": lambda c, s: _is(
        one(
            c,
            "SELECT status FROM outbox.decide_approval_v1(%s, %s, 'approve', 'alice')",
            [A, s.approval_id],
        ),
        "approved",
    ),
    "deliver_key_v1": lambda c, s: _is(one(c, "SELECT outbox.deliver_key_v1(7)"), "deliver:7"),
    # A row this worker holds no lease on: nothing dropped (its statements ran, refused nothing).
    "drop_if_run_over_v1": lambda c, s: _is(
        one(c, "SELECT outbox.drop_if_run_over_v1(0, 'w', 1, 'retry_later', 'not retried', 'e')"),
        False,
    ),
    # Large payloads by reference (0040).
    "payload_inline_max_v1": lambda c, s: _is(
        one(c, "SELECT outbox.payload_inline_max_v1()"), 8192
    ),
    "payload_digest_v1": lambda c, s: _is(
        one(c, "SELECT outbox.payload_digest_v1('abc')"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    ),
    "payload_ref_v1": lambda c, s: _is(
        one(c, "SELECT outbox.payload_ref_v1(repeat('a', 9000)) ->> 'bytes'"), "9000"
    ),
    "resolved_text_v1": lambda c, s: _is(
        one(c, "SELECT outbox.resolved_text_v1('inline', %s, NULL)", [A]), "inline"
    ),
    "resolved_json_v1": lambda c, s: _is(
        one(c, "SELECT outbox.resolved_json_v1('[1]', %s, NULL)", [A]), [1]
    ),
    "sweep_payloads_v1": lambda c, s: _is(
        one(c, "SELECT outbox.sweep_payloads_v1(ARRAY[]::text[])"), 0
    ),
    "run_span_events_v1": lambda c, s: _is(
        one(
            c,
            "SELECT array_agg(event) FROM outbox.run_span_events_v1(%s, '-infinity')",
            [[s.queued.id]],
        ),
        ["run.created"],
    ),
    "end_run_v1": lambda c, s: _is(
        one(
            c,
            "SELECT status FROM outbox.end_run_v1(%s, 'failed', 'step_cap', 'stopped')",
            [s.waiting.id],
        ),
        "failed",
    ),
    "enter_tenant_v1": lambda c, s: one(c, "SELECT outbox.enter_tenant_v1(%s)", [A]),
    "keep_orphaned_results_v1": lambda c, s: _is(
        one(
            c,
            "SELECT reason FROM outbox.keep_orphaned_results_v1(%s)",
            [json.dumps([result(s) | {"reason": "fenced"}])],
        ),
        "fenced",
    ),
    "erase_thread_v1": lambda c, s: _is(
        one(
            c,
            "SELECT jsonb_array_length(outbox.erase_thread_v1(%s, "
            "(SELECT thread_id FROM outbox.runs WHERE id = %s), 'dpo') -> 'cancelled_runs')",
            [A, s.waiting.id],
        ),
        1,
    ),
    "retain_v1": lambda c, s: _is(one(c, "SELECT count(*) FROM outbox.retain_v1(10)"), 0),
    "archive_partitions_v1": lambda c, s: _is(
        one(c, "SELECT outbox.archive_partitions_v1(1)"),
        0,  # no archiving policy
    ),
    "journal_partitions_v1": lambda c, s: _is_a(
        one(c, "SELECT outbox.journal_partitions_v1(1)"), int
    ),  # 0 unless the template was migrated before midnight
    "prune_archive_v1": lambda c, s: _is(
        one(c, "SELECT count(*) FROM outbox.prune_archive_v1()"), 0
    ),
    "lane_loads_v1": lambda c, s: _is(
        one(c, "SELECT in_flight FROM outbox.lane_loads_v1() WHERE name = 'lookup_order'"), 0
    ),
    "model_turn_key_v1": lambda c, s: _is_a(
        one(c, "SELECT outbox.model_turn_key_v1(gen_random_uuid(), 1)"), str
    ),
    "record_model_turn_v1": lambda c, s: _is(
        one(
            c,
            "SELECT run_status FROM outbox.record_model_turn_v1(%s, '[]')",
            [json.dumps(turn_json(s))],
        ),
        "completed",
    ),
    "record_model_turns_v1": lambda c, s: _is(
        one(
            c,
            "SELECT run_status FROM outbox.record_model_turns_v1(%s, '[[]]')",
            [json.dumps([turn_json(s)])],
        ),
        "completed",
    ),
    "record_tool_results_v1": lambda c, s: _is(
        one(
            c,
            "SELECT outcome FROM outbox.record_tool_results_v1(%s, 'w')",
            [json.dumps([result(s)])],
        ),
        "stored",
    ),
    "require_tenant_scope_v1": lambda c, s: one(
        c, "SELECT outbox.require_tenant_scope_v1(%s, 'test')", [A]
    ),
    "run_active_v1": lambda c, s: _is(one(c, "SELECT outbox.run_active_v1('queued')"), True),
    "run_ended_v1": lambda c, s: _is(one(c, "SELECT outbox.run_ended_v1('expired')"), True),
    "run_over_v1": lambda c, s: _is(
        one(c, "SELECT outbox.run_over_v1('requires_action', now() - interval '1 s')"), True
    ),
    "same_run_request_v1": lambda c, s: _is(
        one(
            c,
            "SELECT created FROM outbox.same_run_request_v1("
            "(SELECT r FROM outbox.runs r WHERE r.id = %s), %s, 'k', 'hello', 'scripted', "
            "'{}')",
            [s.queued.id, s.queued.thread_id],
        ),
        False,
    ),
    "start_run_v1": start_run,
    "start_run_v2": start_run_traced,
    "start_run_v3": start_run_with_options,
    "model_options_problem_v1": lambda c, s: _is(
        one(c, "SELECT outbox.model_options_problem_v1('{\"top_p\": 2}')"),
        "top_p is a number from 0 to 1",
    ),
    "submit_tool_outputs_v1": lambda c, s: _is(
        one(
            c,
            "SELECT outbox.submit_tool_outputs_v1(%s, %s, %s)",
            [A, s.waiting.id, json.dumps([{"tool_call_id": "c1", "output": {"ok": True}}])],
        ),
        "in_progress",  # no client call left: the relay's call runs on
    ),
    "report_model_calls_v1": lambda c, s: _is(
        c.execute(
            "SELECT state, was FROM outbox.report_model_calls_v1("
            "'{http://down.invalid/v1}', '{9}', '{0}')"
        ).fetchall(),
        [("open", "closed")],
    ),
    "claim_model_probe_v1": lambda c, s: _is(
        one(c, "SELECT outbox.claim_model_probe_v1('http://never-failed.invalid/v1')"), False
    ),
    "tool_call_key_v1": lambda c, s: _is(
        one(c, "SELECT outbox.tool_call_key_v1(7)"), "tool_call:7"
    ),
}


def _is(value: Any, expected: Any) -> None:
    assert value == expected


def _is_a(value: Any, kind: type) -> None:
    assert isinstance(value, kind), value


@pytest.fixture
def login_url(db_url: str) -> Iterator[str]:
    """A login role bound to tenant A (cluster-wide: named uniquely, dropped after)."""
    role = f"backend_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(12)
    with psycopg.connect(db_url) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        tenancy.grant_role(conn, A, role, actor="test")
        conn.commit()
    try:
        yield make_conninfo(**{**conninfo_to_dict(db_url), "user": role, "password": password})
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


@contextmanager
def as_role(db_url: str, role: str, login_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection acting as ``role`` for tenant A; every transaction is rolled back."""
    with psycopg.connect(login_url if role == LOGIN else db_url) as conn:
        if role != LOGIN:
            conn.execute(f"SET ROLE {role}")
            conn.commit()
        yield conn


def granted(db_url: str, role: str, login_url: str) -> list[str]:
    with as_role(db_url, role, login_url) as conn:
        return [r[0] for r in conn.execute(GRANTED)]


def test_the_roles_are_the_ones_the_migrations_create(conn):
    found = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'outbox\\_%'")
    assert sorted(r[0] for r in found) == sorted(ROLES)


@pytest.mark.parametrize("role", [*ROLES, LOGIN])
def test_every_function_a_role_may_execute_works_for_it(db_url, login_url, role):
    s = seed(db_url)
    functions = granted(db_url, role, login_url)
    assert set(functions) <= set(CALLS), f"add a call of {sorted(set(functions) - set(CALLS))}"
    refused = {}
    with as_role(db_url, role, login_url) as conn:
        for name in functions:
            conn.execute("SELECT set_config('outbox.tenant_id', %s, true)", [A])
            try:
                CALLS[name](conn, s)
            except psycopg.Error as err:
                refused[name] = f"{err.sqlstate}: {err.diag.message_primary}"
            conn.rollback()
    assert refused == {}, f"{role} is granted functions it cannot run: {refused}"


def test_outbox_api_may_not_record_model_turns(db_url, login_url):
    """`outbox serve` records no turns: the grant was dropped, not completed (0030)."""
    assert not {"record_model_turn_v1", "record_model_turns_v1"} & set(
        granted(db_url, "outbox_api", login_url)
    )


def test_outbox_relay_may_not_start_create_or_cancel(db_url, login_url):
    """The relay claims, executes and records: leaked relay credentials start nothing (0041)."""
    writers_entry_points = {
        "create_thread_v1",
        "start_run_v1",
        "start_run_v2",
        "start_run_v3",
        "same_run_request_v1",
        "cancel_run_v1",
    }
    assert not writers_entry_points & set(granted(db_url, "outbox_relay", login_url))
    with (
        as_role(db_url, "outbox_relay", login_url) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT outbox.create_thread_v1(%s)", [A])
