"""The console's test kit: accounts, a signed-in HTTP client, a call waiting for approval.

Shared by the console's HTTP tests and its browser tests (``tests/integration/
test_console.py``, ``tests/acceptance/test_console_browser.py``).
"""

from __future__ import annotations

import re
from typing import Any

import httpx2
import psycopg

from outbox import accounts, ops, writer
from tests.helpers import add_tool, new_run, turn

PASSWORD = "correct horse battery staple"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def add_user(db_url: str, name: str, tenant: str, role: str, password: str = PASSWORD) -> None:
    with psycopg.connect(db_url) as conn:
        accounts.add_user(conn, name, tenant_id=tenant, role=role, password=password)


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, html
    return found.group(1)


def sign_in(console: str, name: str, password: str = PASSWORD) -> tuple[httpx2.Client, int]:
    """A client that signed in as ``name`` at ``console`` (``.../console``), and the status
    of its sign-in (303 when it succeeded)."""
    client = httpx2.Client(base_url=console, timeout=30)
    form = client.get("/sign-in")
    answer = client.post(
        "/sign-in",
        data={"name": name, "password": password, "csrf_token": csrf_of(form.text)},
    )
    return client, answer.status_code


def waiting_call(
    db_url: str, arguments: dict[str, Any], *, tenant: str = "acme", tool: str = "send_money"
) -> tuple[writer.RunRef, int]:
    """A run of ``tenant`` whose call of the high-risk ``tool`` waits for a reviewer (the
    default policy asks for one); its run and the approval's id."""
    with psycopg.connect(db_url) as conn:
        exists = conn.execute("SELECT 1 FROM outbox.tools WHERE name = %s", [tool]).fetchone()
        if exists is None:
            add_tool(conn, tool, risk_tier="high", json_schema={"type": "object"})
        run = new_run(conn, tenant=tenant, tools=[tool])
        writer.record_model_turn(conn, turn(run, 1, ("call_1", tool, arguments)))
        (approval_id,) = conn.execute(
            "SELECT id FROM outbox.approvals WHERE run_id = %s", [run.id]
        ).fetchone()
    return run, approval_id


def quarantined_call(db_url: str, *, tenant: str = "acme") -> int:
    """A call of a low-risk tool of a run of ``tenant``, quarantined by an operator; its
    reference (``tool_calls.id``)."""
    with psycopg.connect(db_url) as conn:
        exists = conn.execute("SELECT 1 FROM outbox.tools WHERE name = 'lookup_order'").fetchone()
        if exists is None:
            add_tool(conn, "lookup_order")
        run = new_run(conn, tenant=tenant, tools=["lookup_order"])
        (ref,) = writer.record_model_turn(
            conn, turn(run, 1, ("call_1", "lookup_order", {"order_id": "7"}))
        ).tool_call_refs
        ops.quarantine(conn, f"call:{ref}", reason="the tool misbehaves", actor="ops")
    return int(ref)


def unknown_call(db_url: str, *, tenant: str = "acme") -> int:
    """A call of a run of ``tenant`` whose outcome is unknown, as the relay leaves one whose
    attempt may have acted (tests/integration/test_ops.py); its reference."""
    ref = quarantined_call(db_url, tenant=tenant)
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE outbox.outbox SET attempts = 1, failures = 1, last_error = 'HTTP 502' "
            "WHERE tool_call_ref = %s",
            [ref],
        )
        conn.execute(
            "UPDATE outbox.tool_calls SET status = 'outcome_unknown', attempts = 1, "
            "last_error = 'HTTP 502', dispatched_attempt = 1 WHERE id = %s",
            [ref],
        )
    return ref
