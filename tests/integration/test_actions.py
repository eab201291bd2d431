"""The action layer: approvals, risk policies, kill switches, paused tenants.

End to end: the relay, the scripted model and the fake tools over HTTP. What the model saw
of a call is read from its own history (the tool output it was sent); what the tool did
from the tool's own audit trail, never from our tables alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import approvals, policy, writer
from outbox.errors import InvalidInput, InvalidTransition, NotFound, NotPermitted
from outbox.schemas import StartRun
from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.relay_harness import (
    register_tool,
    relay_thread,
    scalar,
    start_relay_process,
    wait_until,
)

TENANT = "acme"
OTHER = "globex"
ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
EMAIL = {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "refund"}}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        server.add_script("email", [{"tool_calls": [EMAIL]}, tell_what_the_tool_said])
        yield server


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService() as svc:
        yield svc


def tell_what_the_tool_said(items: list[HistoryItem]) -> dict[str, Any]:
    outputs = [i.text for i in items if i.kind == "tool_output"]
    return {"text": "the tool said: " + " | ".join(outputs)}


def setup_tool(db_url: str, service: FakeToolService, **kw: Any) -> None:
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", "key", **kw)
        conn.commit()


def start(db_url: str, model: ScriptedModel, tenant: str = TENANT) -> writer.RunRef:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, tenant).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=tenant,
                thread_id=thread,
                model="scripted-1",
                message="script:email please",
                tools=["send_email"],
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
    return run


def status(db_url: str, run_id: uuid.UUID) -> str:
    return str(scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [run_id]))


def ended(db_url: str, run_id: uuid.UUID) -> bool:
    return status(db_url, run_id) in ("completed", "failed", "cancelled", "expired")


def final_text(db_url: str, run_id: uuid.UUID) -> str:
    return str(
        scalar(
            db_url,
            "SELECT content FROM outbox.messages WHERE run_id = %s AND role = 'assistant' "
            "ORDER BY seq DESC LIMIT 1",
            [run_id],
        )
    )


def pending_approval(db_url: str, run_id: uuid.UUID) -> dict[str, Any] | None:
    with psycopg.connect(db_url) as conn:
        rows = approvals.list_approvals(conn, "pending")
    return next((r for r in rows if r["run_id"] == run_id), None)


def events(db_url: str, run_id: uuid.UUID | None, prefix: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(
            "SELECT event, actor, detail, tenant_id FROM outbox.journal "
            "WHERE (%s::uuid IS NULL OR run_id = %s) AND event LIKE %s ORDER BY id",
            [run_id, run_id, prefix + "%"],
        )
        return cur.fetchall()


def decide(db_url: str, approval_id: int, decision: str, actor: str, **kw: Any) -> dict[str, Any]:
    with psycopg.connect(db_url) as conn:
        row = approvals.decide(conn, approval_id, decision, actor=actor, **kw)
        conn.commit()
    return row


# -- approvals ----------------------------------------------------------------------------


def test_a_high_risk_call_waits_and_one_approval_given_twice_executes_once(db_url, model, service):
    setup_tool(db_url, service, risk_tier="high")
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        assert waiting["tool_name"] == "send_email"
        assert waiting["arguments"] == EMAIL["arguments"]
        assert waiting["rule"] == "policy */high: approve"
        calls = scalar(db_url, "SELECT status FROM outbox.tool_calls WHERE run_id = %s", [run.id])
        assert calls == "awaiting_approval"
        assert status(db_url, run.id) == "in_progress"
        # Waiting for a person is not being stuck.
        assert scalar(db_url, "SELECT count(*) FROM outbox.stuck_runs") == 0
        assert service.tool("send_email").deliveries == []

        approved = decide(db_url, waiting["id"], "approve", "alice", reason="checked")
        assert approved["status"] == "approved" and approved["decided_by"] == "alice"
        with pytest.raises(InvalidTransition, match="already decided: approved by alice"):
            decide(db_url, waiting["id"], "approve", "alice")
        with pytest.raises(InvalidTransition, match="already decided"):
            decide(db_url, waiting["id"], "deny", "bob")
        wait_until(lambda: ended(db_url, run.id), what="the run to end")

    assert status(db_url, run.id) == "completed"
    assert len(service.tool("send_email").deliveries) == 1
    assert len(service.tool("send_email").effects) == 1
    assert "the tool said:" in final_text(db_url, run.id)
    assert "denied" not in final_text(db_url, run.id)
    journaled = [(e["event"], e["actor"]) for e in events(db_url, run.id, "approval.")]
    assert journaled == [("approval.requested", None), ("approval.approved", "alice")]


def test_a_denied_call_never_runs_and_the_model_sees_the_reviewers_reason(db_url, model, service):
    setup_tool(db_url, service, requires_approval=True)  # a low tier that asks anyway
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        assert waiting["rule"] == "tool send_email requires approval"
        decide(db_url, waiting["id"], "deny", "carol", reason="not to this customer")
        wait_until(lambda: ended(db_url, run.id), what="the run to end")
    assert status(db_url, run.id) == "completed"
    assert service.tool("send_email").deliveries == []
    said = final_text(db_url, run.id)
    assert "denied by reviewer carol: not to this customer" in said
    assert "not executed" in said
    assert [e["event"] for e in events(db_url, run.id, "approval.")][-1] == "approval.denied"


def test_no_decision_by_the_deadline_denies_the_call(db_url, model, service):
    setup_tool(db_url, service, risk_tier="high")
    with psycopg.connect(db_url) as conn:
        policy.set_policy(conn, TENANT, "high", "approve", approval_timeout_s=0.5, actor="ops")
        conn.commit()
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        assert waiting["rule"] == f"policy {TENANT}/high: approve"
        wait_until(lambda: ended(db_url, run.id), what="the deadline to deny the call")
    assert status(db_url, run.id) == "completed"
    assert service.tool("send_email").deliveries == []
    assert "denied by policy: no reviewer approved it before" in final_text(db_url, run.id)
    expired = events(db_url, run.id, "approval.expired")
    assert len(expired) == 1 and expired[0]["actor"] == "deadline"
    with pytest.raises(InvalidTransition):  # too late, whoever asks
        decide(db_url, waiting["id"], "approve", "alice")
    assert service.tool("send_email").deliveries == []


def test_an_approval_is_bound_to_its_arguments_and_its_approvers(db_url, model, service):
    setup_tool(db_url, service, risk_tier="high")
    with psycopg.connect(db_url) as conn:
        policy.set_policy(conn, TENANT, "high", "approve", approvers=["bob"], actor="ops")
        conn.commit()
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        with pytest.raises(NotPermitted, match="alice may not decide"):
            decide(db_url, waiting["id"], "approve", "alice")
        with pytest.raises(InvalidInput, match="digest"):
            decide(db_url, waiting["id"], "approve", "bob", digest="sha256-of-other-arguments")
        with pytest.raises(NotFound):
            decide(db_url, waiting["id"], "approve", "bob", tenant_id=OTHER)
        assert service.tool("send_email").deliveries == []
        decide(db_url, waiting["id"], "approve", "bob", digest=waiting["arguments_digest"])
        wait_until(lambda: ended(db_url, run.id), what="the run to end")
    assert len(service.tool("send_email").effects) == 1


def test_a_waiting_row_made_due_by_hand_is_answered_not_approved_never_run(db_url, model, service):
    setup_tool(db_url, service, risk_tier="high")
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        with psycopg.connect(db_url) as conn:
            held = conn.execute(
                "UPDATE outbox.outbox SET available_at = now() WHERE run_id = %s "
                "AND available_at = 'infinity'",
                [run.id],
            ).rowcount
            conn.commit()
        assert held == 1
        wait_until(lambda: ended(db_url, run.id), what="the run to end")
    assert service.tool("send_email").deliveries == []
    assert "not approved" in final_text(db_url, run.id)


def test_requeue_of_delayed_rows_leaves_waiting_calls_waiting(db_url, model, service):
    from outbox import ops

    setup_tool(db_url, service, risk_tier="high")
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
    with psycopg.connect(db_url) as conn:
        changes = ops.requeue_matching(conn, state="delayed", actor="ops")
        conn.commit()
    assert [c for c in changes if c.applied] == []
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE available_at = 'infinity'") == 1


@pytest.mark.parametrize("mode", ["key", "none"])
def test_a_relay_killed_after_the_approval_executes_the_call_once(
    db_url, model, service, tmp_path: Path, mode: str
):
    """kill -9 of the relay process while the approved call is in flight. A tool that
    honours keys is called again with the same key (one effect, by its own audit); one that
    does not is never called again: the call is left for an operator (outcome_unknown).
    Either way the one approval is not asked for, nor consumed, a second time."""
    service.add_tool("send_email_once", mode)  # type: ignore[arg-type]
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", mode, risk_tier="high",
                      endpoint=service.endpoint("send_email_once"))  # fmt: skip
        conn.commit()
    tool = service.tool("send_email_once")
    # The first attempt's effect happens, then its answer is held back 1.5 s (the tool's
    # timeout is 2 s): the relay is killed while it waits for that answer.
    tool.stall_after_commit(1.5, n=1)
    run = start(db_url, model)
    log = tmp_path / "relay.log"
    kinds = [a for k in ALL_KINDS for a in ("--kind", k)]
    first = start_relay_process(db_url, log, *kinds, "--lease", "2")
    try:
        waiting = wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        decide(db_url, waiting["id"], "approve", "alice")
        wait_until(lambda: tool.deliveries, what="the call to start")
        first.kill()  # kill -9: the call's outcome is unknown to us
        first.wait(timeout=30)
        assert first.returncode == -9
        results = "SELECT count(*) FROM outbox.tool_results WHERE run_id = %s"
        assert scalar(db_url, results, [run.id]) == 0  # it was in flight: nothing recorded
        # The relay that takes over runs in a thread: only the killed one must be a process.
        with relay_thread(db_url, kinds=ALL_KINDS):
            if mode == "key":
                wait_until(lambda: ended(db_url, run.id), timeout_s=60, what="the run to end")
            else:
                wait_until(
                    lambda: (
                        scalar(db_url, "SELECT status FROM outbox.tool_calls WHERE run_id = %s",
                               [run.id]) == "outcome_unknown"
                    ),
                    timeout_s=60,
                    what="the call to be left for an operator",
                )  # fmt: skip
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    assert len(tool.effects) == 1  # by the tool's own audit
    assert {d.key for d in tool.deliveries} == {tool.deliveries[0].key}  # one key
    if mode == "key":
        assert status(db_url, run.id) == "completed"
        assert len(tool.deliveries) == 2  # called again after the kill, with the same key
    else:
        assert len(tool.deliveries) == 1  # never on a guess
    assert scalar(db_url, "SELECT count(*) FROM outbox.approvals") == 1
    assert scalar(db_url, "SELECT status FROM outbox.approvals") == "approved"
    assert [e["event"] for e in events(db_url, run.id, "approval.")] == [
        "approval.requested",
        "approval.approved",
    ]


# -- risk policies ------------------------------------------------------------------------


def test_a_deny_policy_for_a_tier_refuses_the_call_at_once_and_journals_the_rule(
    db_url, model, service
):
    setup_tool(db_url, service, risk_tier="medium")
    with psycopg.connect(db_url) as conn:
        policy.set_policy(conn, TENANT, "medium", "deny", actor="ops")
        conn.commit()
    run = start(db_url, model)
    other = start(db_url, model, tenant=OTHER)  # the default allows medium
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: ended(db_url, run.id) and ended(db_url, other.id), what="both runs")
    assert "denied by policy (policy acme/medium: deny)" in final_text(db_url, run.id)
    assert "denied" not in final_text(db_url, other.id)
    assert len(service.tool("send_email").deliveries) == 1  # the other tenant's call only
    (intended,) = events(db_url, run.id, "tool_call.intended")
    assert intended["detail"]["policy"] == {"action": "deny", "rule": "policy acme/medium: deny"}
    assert [e["actor"] for e in events(db_url, None, "policy.set")] == ["ops"]


def test_policy_input_is_checked(db_url):
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidInput, match="risk tier"):
            policy.set_policy(conn, TENANT, "extreme", "deny")
        with pytest.raises(InvalidInput, match="action"):
            policy.set_policy(conn, TENANT, "high", "maybe")
        with pytest.raises(InvalidInput, match="cannot be removed"):
            policy.clear_policy(conn, "*", "high")


# -- kill switches ------------------------------------------------------------------------


def test_disabling_a_shared_tool_for_one_tenant_stops_its_queued_calls_only(db_url, model, service):
    setup_tool(db_url, service)  # shared by every tenant ('*')
    mine, theirs = start(db_url, model), start(db_url, model, tenant=OTHER)
    # Record each run's first turn without a tool relay: their calls are queued.
    with relay_thread(db_url, kinds=("model_turn",)):
        wait_until(
            lambda: scalar(db_url, "SELECT count(*) FROM outbox.tool_calls") == 2,
            what="both calls to be queued",
        )
    with psycopg.connect(db_url) as conn:
        switch = policy.disable_tool(conn, "send_email", TENANT, actor="ops", reason="incident 42")
        conn.commit()
    assert switch is not None and switch["switched_by"] == "ops"
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: ended(db_url, mine.id) and ended(db_url, theirs.id), what="the runs")
    said = final_text(db_url, mine.id)
    assert "'send_email' is disabled for tenant acme by ops: incident 42" in said
    assert "denied" not in final_text(db_url, theirs.id)
    deliveries = service.tool("send_email").deliveries
    assert [d.headers["x-outbox-run-id"] for d in deliveries] == [str(theirs.id)]
    (disabled,) = events(db_url, None, "tool.disabled")
    assert disabled["actor"] == "ops" and disabled["tenant_id"] == TENANT

    # Calls recorded while it is off are refused when recorded; switched on, they run.
    again = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: ended(db_url, again.id), what="the run while disabled")
        assert "is disabled for tenant acme" in final_text(db_url, again.id)
        with psycopg.connect(db_url) as conn:
            assert policy.enable_tool(conn, "send_email", TENANT, actor="ops")
            conn.commit()
        last = start(db_url, model)
        wait_until(lambda: ended(db_url, last.id), what="the run after enabling")
    assert "disabled" not in final_text(db_url, last.id)
    assert len(service.tool("send_email").deliveries) == 2


def test_switches_name_what_is_not_registered(db_url, service):
    setup_tool(db_url, service, tenant_id=OTHER)  # only the other tenant has it
    with psycopg.connect(db_url) as conn:
        with pytest.raises(NotFound, match="not registered for tenant acme"):
            policy.disable_tool(conn, "send_email", TENANT, actor="ops")
        with pytest.raises(NotFound):
            policy.disable_tool(conn, "no_such_tool", actor="ops")
        assert policy.disable_tool(conn, "send_email", OTHER, actor="ops") is not None
        assert policy.disable_tool(conn, "send_email", OTHER, actor="ops") is None  # kept


# -- paused tenants -----------------------------------------------------------------------


def test_a_paused_tenant_holds_between_steps_and_resumes_where_it_held(db_url, model, service):
    setup_tool(db_url, service)
    with psycopg.connect(db_url) as conn:
        assert policy.pause_tenant(conn, TENANT, actor="ops", reason="billing dispute")
        conn.commit()
    paused, other = start(db_url, model), start(db_url, model, tenant=OTHER)
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: ended(db_url, other.id), what="the other tenant's run")
        # The other tenant's run went through the same relay; the paused one never started.
        assert status(db_url, paused.id) == "queued"
        assert len(model.requests) == 2  # the other run's two turns
        with psycopg.connect(db_url) as conn:
            assert policy.resume_tenant(conn, TENANT, actor="ops")
            conn.commit()
        wait_until(lambda: ended(db_url, paused.id), what="the resumed run")
    assert status(db_url, paused.id) == "completed"
    assert [e["event"] for e in events(db_url, None, "tenant.")] == [
        "tenant.paused",
        "tenant.resumed",
    ]


def test_cancelling_a_run_closes_its_waiting_call_and_expires_the_approval(db_url, model, service):
    from outbox import lifecycle

    setup_tool(db_url, service, risk_tier="high")
    run = start(db_url, model)
    with relay_thread(db_url, kinds=ALL_KINDS):
        waiting = wait_until(lambda: pending_approval(db_url, run.id), what="an approval")
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, run.id, TENANT, actor="ops")
            conn.commit()
        wait_until(
            lambda: (
                scalar(db_url, "SELECT status FROM outbox.approvals WHERE id = %s", [waiting["id"]])
                == "expired"
            ),
            what="the sweep to expire the approval",
        )
    call = scalar(db_url, "SELECT status FROM outbox.tool_calls WHERE run_id = %s", [run.id])
    assert call == "cancelled"
    answer = scalar(
        db_url, "SELECT content FROM outbox.messages WHERE run_id = %s AND role = 'tool'", [run.id]
    )
    assert "not executed" in answer
    assert service.tool("send_email").deliveries == []
    with pytest.raises(InvalidTransition):
        decide(db_url, waiting["id"], "approve", "alice")


def test_backends_decide_in_sql_as_outbox_writer_for_their_own_tenant_only(conn):
    from tests.helpers import add_tool, new_run, turn

    add_tool(conn, "send_email", risk_tier="high")
    run = new_run(conn, tenant="tenant-b", tools=["send_email"])
    writer.record_model_turn(conn, turn(run, 1, ("call_1", "send_email", {"order_id": "7"})))
    conn.commit()
    decide_sql = "SELECT status FROM outbox.decide_approval_v1(%s, %s, 'approve', 'backend-bot')"
    (approval_id,) = conn.execute("SELECT id FROM outbox.approvals").fetchone()
    conn.execute("SET LOCAL ROLE outbox_writer")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="has none"):
        conn.execute(decide_sql, ["tenant-b", approval_id])
    conn.rollback()
    conn.execute("SET LOCAL ROLE outbox_writer")
    conn.execute("SELECT outbox.enter_tenant_v1('tenant-a')")
    assert conn.execute("SELECT count(*) FROM outbox.approvals").fetchone() == (0,)  # RLS
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not tenant-b"):
        conn.execute(decide_sql, ["tenant-b", approval_id])
    conn.rollback()
    conn.execute("SET LOCAL ROLE outbox_writer")
    conn.execute("SELECT outbox.enter_tenant_v1('tenant-b')")
    assert conn.execute(decide_sql, ["tenant-b", approval_id]).fetchone() == ("approved",)
    conn.commit()
    due = conn.execute(
        "SELECT available_at <= now() FROM outbox.outbox WHERE kind = 'tool_call'"
    ).fetchone()
    assert due == (True,)


# -- pinned tool versions -----------------------------------------------------------------


def test_a_run_keeps_the_tool_versions_it_started_with(db_url, model, service):
    """v2 registered after the run started (another schema, another endpoint): the run's
    model still sees v1's schema, its call is validated against v1 and sent to v1's
    endpoint; a run started after the registration uses v2."""
    v1_schema = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}
    v2_schema = {"type": "object", "required": ["customer_id"]}
    setup_tool(db_url, service, json_schema=v1_schema)
    service.add_tool("send_email_v2", "key")
    run = start(db_url, model)
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "send_email", "key", json_schema=v2_schema,
                      endpoint=service.endpoint("send_email_v2"))  # fmt: skip
        conn.commit()
    later = start(db_url, model, tenant=OTHER)
    with relay_thread(db_url, kinds=ALL_KINDS):
        wait_until(lambda: ended(db_url, run.id) and ended(db_url, later.id), what="the runs")
    pins = scalar(db_url, "SELECT tool_pins FROM outbox.runs WHERE id = %s", [run.id])
    assert pins == {"send_email": {"tenant_id": "*", "version": 1}}
    later_pins = scalar(db_url, "SELECT tool_pins FROM outbox.runs WHERE id = %s", [later.id])
    assert later_pins == {"send_email": {"tenant_id": "*", "version": 2}}
    # v1's endpoint ran the first run's call; v2's schema refused the later run's arguments.
    (delivery,) = service.tool("send_email").deliveries
    assert delivery.headers["x-outbox-run-id"] == str(run.id)
    assert service.tool("send_email_v2").deliveries == []
    assert "do not match its schema" in final_text(db_url, later.id)
    with psycopg.connect(db_url) as conn:
        versions = dict(conn.execute("SELECT run_id, tool_version FROM outbox.tool_calls"))
    assert versions == {run.id: 1, later.id: 2}
    sent = {
        json.dumps([t.get("parameters") for t in r.tools], sort_keys=True)
        for r in model.requests
        if r.tools
    }
    assert sent == {
        json.dumps([v1_schema], sort_keys=True),
        json.dumps([v2_schema], sort_keys=True),
    }


def test_two_reviewers_approving_at_once_make_one_decision(conn, db_url):
    """Both decisions start together; the run's lock serialises them: one wins, the other
    is told who decided, and the call has one outbox row, due once."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.helpers import add_tool, new_run, turn

    add_tool(conn, "send_email", risk_tier="high")
    run = new_run(conn, tools=["send_email"])
    writer.record_model_turn(conn, turn(run, 1, ("call_1", "send_email", {"order_id": "7"})))
    conn.commit()
    (approval_id,) = conn.execute("SELECT id FROM outbox.approvals").fetchone()
    barrier = __import__("threading").Barrier(2)

    def approve(who: str) -> str:
        with psycopg.connect(db_url) as own:
            barrier.wait(timeout=30)
            try:
                approvals.decide(own, approval_id, "approve", actor=who)
                own.commit()
                return "won"
            except InvalidTransition as err:
                return f"refused: {err}"

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(approve, ["alice", "bob"]))
    assert sorted(o.split(":")[0] for o in outcomes) == ["refused", "won"]
    assert "already decided: approved by" in next(o for o in outcomes if o != "won")
    conn.rollback()  # a new transaction: its now() comes after the decisions
    rows = conn.execute(
        "SELECT count(*), bool_and(available_at <= now()) FROM outbox.outbox "
        "WHERE kind = 'tool_call'"
    ).fetchone()
    assert rows == (1, True)
    decided = conn.execute(
        "SELECT count(*) FROM outbox.journal WHERE event = 'approval.approved'"
    ).fetchone()
    assert decided == (1,)
