"""Large payloads by reference (migration 0040): arguments, results and tool messages over
``outbox.payload_inline_max`` bytes (8192 by default) are stored once per tenant in
``payloads`` by digest; every reader resolves them; the journal names them by digest and
size; erasure and retention leave no body behind that nothing references, and never delete
one that something does, even while another transaction is referencing it right then."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from outbox import config, history, retention, writer
from outbox.errors import PayloadTooLarge
from outbox.schemas import StartRun, ToolResultIn
from outbox.testing.scripted_model import HistoryItem, ScriptedModel
from outbox.testing.tools import FakeToolService
from tests.helpers import TENANT, add_tool, new_run, turn
from tests.relay_harness import register_tool, relay_thread, scalar, wait_until

ALL_KINDS = ("model_turn", "tool_call", "deliver_batch")
INLINE_MAX = 8192


def big(tag: str, size: int = 20_000) -> str:
    """A text of ``size`` characters that no other test body shares."""
    return (tag + "-" + uuid.uuid4().hex + "-") * (size // 40 + 1)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def rows(db_url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


def payload_digests(db_url: str) -> set[str]:
    return {r[0] for r in rows(db_url, "SELECT digest FROM outbox.payloads")}


def unreferenced(db_url: str) -> list[str]:
    """Bodies nothing references (what the sweeps must leave none of)."""
    return [
        r[0]
        for r in rows(
            db_url,
            "SELECT p.digest FROM outbox.payloads p "
            "WHERE NOT outbox.payload_referenced_v1(p.digest, p.tenant_id)",
        )
    ]


# -- a run through the relay ---------------------------------------------------------------


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(default=[{"text": "hello"}]) as server:
        yield server


def test_a_large_argument_and_result_round_trip_through_a_run(db_url, model):
    note = big("argument")
    seen: list[str] = []

    def after(items: list[HistoryItem]) -> dict[str, str]:
        seen.extend(i.text for i in items if i.kind == "tool_output")
        return {"text": "done"}

    model.add_script(
        "big", [{"tool_calls": [{"name": "echo", "arguments": {"note": note}}]}, after]
    )
    with FakeToolService() as service, psycopg.connect(db_url) as conn:
        service.add_tool("echo", "key", lambda arguments, _effect: {"echo": arguments})
        register_tool(conn, service, "echo", "key", timeout_s=30.0)
        thread = writer.create_thread(conn, TENANT)
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT,
                thread_id=thread.id,
                model="scripted",
                message="script:big go",
                tools=["echo"],
                base_url=model.url + "/v1",
            ),
        )
        conn.commit()
        with relay_thread(db_url, kinds=ALL_KINDS):
            wait_until(
                lambda: scalar(db_url, "SELECT status FROM outbox.runs") == "completed",
                what="the run to complete",
            )
        # The relay sent the tool the body, not a reference.
        [delivery] = service.tool("echo").deliveries
        assert delivery.arguments == {"note": note}
    # The model received the tool's whole result.
    assert len(seen) == 1 and json.loads(seen[0]) == {"echo": {"note": note}}

    # Stored by reference: the rows hold digests, the bodies are in payloads once each.
    [(args_raw, args, args_ref)] = rows(
        db_url, "SELECT arguments_raw, arguments, arguments_ref FROM outbox.tool_calls"
    )
    assert (args_raw, args) == ("", None) and args_ref is not None
    [(output, output_ref)] = rows(db_url, "SELECT output, output_ref FROM outbox.tool_results")
    assert output is None and output_ref == digest(json.dumps({"echo": {"note": note}}))
    [(content, content_ref)] = rows(
        db_url, "SELECT content, content_ref FROM outbox.messages WHERE role = 'tool'"
    )
    # The tool message's text is the result's canonical JSON: one body for both.
    assert content is None and content_ref == output_ref
    assert payload_digests(db_url) == {args_ref, output_ref}

    # The journal names the bodies by digest and size, and holds neither.
    events = dict(
        rows(
            db_url,
            "SELECT event, detail -> 'payload' FROM outbox.journal "
            "WHERE event IN ('tool_call.intended', 'tool_result.stored')",
        )
    )
    assert events["tool_call.intended"]["digest"] == args_ref
    assert events["tool_result.stored"] == {
        "digest": output_ref,
        "bytes": len(json.dumps({"echo": {"note": note}})),
    }
    assert (
        scalar(
            db_url,
            "SELECT count(*) FROM outbox.journal WHERE detail::text LIKE %s",
            [f"%{note[:60]}%"],
        )
        == 0
    )
    # ... and a DBA resolves them.
    resolved = dict(rows(db_url, "SELECT event, body FROM outbox.journal_payloads"))
    assert json.loads(resolved["tool_call.intended"]) == {"note": note}
    assert json.loads(resolved["tool_result.stored"]) == {"echo": {"note": note}}

    # Replay and the Python API see the bodies.
    with psycopg.connect(db_url) as conn:
        messages, _ = history.replay(conn, run.thread_id, TENANT)
        shown = json.dumps(messages)
        assert json.dumps(json.dumps({"note": note}))[1:-1] in shown
        ref = scalar(db_url, "SELECT id FROM outbox.tool_calls")
        again = writer.record_tool_result(
            conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output={})
        )
        assert again.outcome == "duplicate"
        assert again.result is not None and again.result["output"] == {"echo": {"note": note}}


# -- the writer, the SQL API --------------------------------------------------------------


def test_the_same_body_in_two_calls_is_stored_once(conn, db_url):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    order = big("order")
    writer.record_model_turn(
        conn,
        turn(
            run,
            1,
            ("c1", "lookup_order", {"order_id": order}),
            ("c2", "lookup_order", {"order_id": order}),
        ),
    )
    refs = [r[0] for r in conn.execute("SELECT id FROM outbox.tool_calls ORDER BY id")]
    result = {"order": order, "status": "shipped"}
    for ref in refs:
        writer.record_tool_result(
            conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output=result)
        )
    writer.deliver_batch(conn, one(conn, "SELECT id FROM outbox.tool_batches"))
    conn.commit()

    raw = json.dumps({"order_id": order})
    assert rows(db_url, "SELECT DISTINCT arguments_ref FROM outbox.tool_calls") == [(digest(raw),)]
    bodies = rows(db_url, "SELECT digest, bytes FROM outbox.payloads ORDER BY bytes")
    # One body for both calls' arguments, one for both results and both tool messages.
    assert len(bodies) == 2
    assert (digest(raw), len(raw.encode())) in bodies
    assert (
        scalar(
            db_url, "SELECT count(DISTINCT content_ref) FROM outbox.messages WHERE role = 'tool'"
        )
        == 1
    )
    messages, _ = history.replay(conn, run.thread_id, TENANT)
    tool_texts = [m["content"] for m in messages if m["role"] == "tool"]
    assert [json.loads(t) for t in tool_texts] == [result, result]


def test_small_payloads_stay_inline_and_cost_no_row(conn, db_url):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "7"})))
    ref = one(conn, "SELECT id FROM outbox.tool_calls")
    # Just under the threshold: inline.
    text = "x" * (INLINE_MAX - len('{"t": ""}'))
    writer.record_tool_result(
        conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output={"t": text})
    )
    conn.commit()
    assert payload_digests(db_url) == set()
    assert rows(db_url, "SELECT arguments_ref, arguments_raw FROM outbox.tool_calls") == [
        (None, '{"order_id": "7"}')
    ]
    assert rows(
        db_url, "SELECT output_ref, octet_length(output::text) FROM outbox.tool_results"
    ) == [(None, INLINE_MAX)]
    assert scalar(db_url, "SELECT count(*) FROM outbox.journal WHERE detail ? 'payload'") == 0


def test_the_threshold_is_a_setting(conn, db_url):
    conn.execute("SET outbox.payload_inline_max = '100'")
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "y" * 200})))
    conn.commit()
    assert scalar(db_url, "SELECT arguments_ref IS NOT NULL FROM outbox.tool_calls")


def test_a_result_over_the_cap_is_still_refused_with_a_clear_error(conn):
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": "7"})))
    ref = one(conn, "SELECT id FROM outbox.tool_calls")
    with pytest.raises(PayloadTooLarge, match=f"over the cap of {config.MAX_PAYLOAD_BYTES} bytes"):
        ToolResultIn(
            tenant_id=TENANT,
            tool_call_ref=ref,
            status="ok",
            output={"t": "z" * (config.MAX_PAYLOAD_BYTES + 1)},
        )


def test_a_tenant_reads_no_other_tenants_body(db_url):
    """Bodies are per tenant (row-level security): the same text of two tenants is two
    rows, and a tenant's role resolves only its own."""
    same = big("shared-across-tenants")
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        for tenant in ("acme", "globex"):
            run = new_run(conn, tenant=tenant, tools=["lookup_order"])
            writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", {"order_id": same})))
        conn.commit()
    assert rows(db_url, "SELECT tenant_id FROM outbox.payloads ORDER BY 1") == [
        ("acme",),
        ("globex",),
    ]
    with psycopg.connect(db_url) as conn:
        conn.execute("SET ROLE outbox_writer")
        conn.execute("SELECT set_config('outbox.tenant_id', 'acme', false)")
        seen = conn.execute("SELECT tenant_id FROM outbox.payloads").fetchall()
    assert seen == [("acme",)]


# -- erasure and retention -----------------------------------------------------------------


def conversation(conn: psycopg.Connection[Any], result: dict[str, Any]) -> writer.RunRef:
    """A thread whose one call has large arguments and the large ``result``."""
    run = new_run(conn, tools=["lookup_order"])
    writer.record_model_turn(
        conn, turn(run, 1, ("c1", "lookup_order", {"order_id": big("own-arguments")}))
    )
    ref = one(conn, "SELECT id FROM outbox.tool_calls WHERE run_id = %s", [run.id])
    writer.record_tool_result(
        conn, ToolResultIn(tenant_id=TENANT, tool_call_ref=ref, status="ok", output=result)
    )
    writer.deliver_batch(
        conn, one(conn, "SELECT id FROM outbox.tool_batches WHERE run_id = %s", [run.id])
    )
    writer.record_model_turn(conn, turn(run, 2, text="done"))  # the run completes
    # No relay runs here: its queue rows (the call, the delivery) are done by hand.
    conn.execute("DELETE FROM outbox.outbox WHERE run_id = %s", [run.id])
    conn.commit()
    return run


def test_erasure_removes_a_threads_bodies_but_those_another_thread_references(conn, db_url):
    add_tool(conn)
    shared = {"report": big("shared-result")}
    first = conversation(conn, shared)
    second = conversation(conn, shared)
    own_first = scalar(
        db_url, "SELECT arguments_ref FROM outbox.tool_calls WHERE run_id = %s", [first.id]
    )
    shared_ref = scalar(
        db_url, "SELECT output_ref FROM outbox.tool_results WHERE run_id = %s", [first.id]
    )
    assert len(payload_digests(db_url)) == 3  # two calls' arguments, one shared result

    detail = retention.erase_thread(conn, first.thread_id, actor="dpo@acme")
    conn.commit()

    assert detail["payloads"] == 1
    digests = payload_digests(db_url)
    assert own_first not in digests and shared_ref in digests
    assert rows(
        db_url,
        "SELECT arguments_ref, arguments_raw FROM outbox.tool_calls WHERE run_id = %s",
        [first.id],
    ) == [(None, "")]
    assert (
        scalar(
            db_url,
            "SELECT count(*) FROM outbox.messages WHERE thread_id = %s "
            "AND (content_ref IS NOT NULL OR content IS NOT NULL)",
            [first.thread_id],
        )
        == 0
    )
    # The other thread still reads its result whole.
    messages, _ = history.replay(conn, second.thread_id, TENANT)
    assert [json.loads(m["content"]) for m in messages if m["role"] == "tool"] == [shared]
    conn.commit()

    retention.erase_thread(conn, second.thread_id, actor="dpo@acme")
    conn.commit()
    assert payload_digests(db_url) == set() and unreferenced(db_url) == []


@pytest.mark.parametrize("mode", ["delete", "archive"])
def test_retention_leaves_no_orphan_body_and_keeps_the_ones_still_referenced(conn, db_url, mode):
    add_tool(conn)
    shared = {"report": big("shared-result")}
    old = conversation(conn, shared)
    young = conversation(conn, shared)
    old_args = scalar(
        db_url, "SELECT arguments_ref FROM outbox.tool_calls WHERE run_id = %s", [old.id]
    )
    body = scalar(db_url, "SELECT body FROM outbox.payloads WHERE digest = %s", [old_args])
    retention.set_policy(conn, "*", timedelta(hours=1), mode=mode, actor="ops@test")
    conn.commit()
    assert scalar(db_url, "SELECT status FROM outbox.runs WHERE id = %s", [old.id]) == "completed"
    params = {"t": old.thread_id, "by": timedelta(hours=2)}  # the conversation ages 2 hours
    conn.execute(
        "UPDATE outbox.threads SET created_at = created_at - %(by)s WHERE id = %(t)s", params
    )
    conn.execute(
        "UPDATE outbox.runs SET created_at = created_at - %(by)s, "
        "updated_at = updated_at - %(by)s, ended_at = ended_at - %(by)s WHERE thread_id = %(t)s",
        params,
    )
    conn.execute(
        "UPDATE outbox.messages SET created_at = created_at - %(by)s WHERE thread_id = %(t)s",
        params,
    )
    conn.commit()

    done = retention.run(conn, actor="ops@test")

    assert done.threads == 1
    digests = payload_digests(db_url)
    assert old_args not in digests
    assert (
        scalar(db_url, "SELECT output_ref FROM outbox.tool_results WHERE run_id = %s", [young.id])
        in digests
    )
    assert unreferenced(db_url) == []
    if mode == "archive":
        # The archived document keeps the bodies inline, no reference.
        document = scalar(
            db_url, "SELECT document FROM outbox.archived_runs WHERE run_id = %s", [old.id]
        )
        [call] = document["tool_calls"]
        assert call["arguments_raw"] == body and "arguments_ref" not in call
        [result] = document["tool_results"]
        assert result["output"] == shared and "output_ref" not in result


def test_the_retention_run_sweeps_a_body_nothing_references(conn, db_url):
    """A body whose row was refused after its trigger stored it (here: a result written by
    hand for a call that has one already, ON CONFLICT DO NOTHING) is swept by the next
    retention run."""
    add_tool(conn)
    conversation(conn, {"report": big("kept")})
    conn.execute(
        "INSERT INTO outbox.tool_results (tool_call_ref, tenant_id, run_id, batch_id, status, "
        "output, source) SELECT id, tenant_id, run_id, batch_id, 'ok', %s, 'operator' "
        "FROM outbox.tool_calls ON CONFLICT (tool_call_ref, tenant_id) DO NOTHING",
        [Jsonb({"report": big("refused")})],
    )
    conn.commit()
    assert len(unreferenced(db_url)) == 1
    done = retention.run(conn, actor="ops@test")
    assert done.payloads_swept == 1 and unreferenced(db_url) == []
    assert len(payload_digests(db_url)) == 2


# -- the race: a sweep against a transaction referencing the same body ---------------------

BODY = {"report": "r" * 20_000}


def orphan_row(conn: psycopg.Connection[Any]) -> int:
    """A row referencing BODY (an orphaned result needs no call: the smallest referrer)."""
    row = conn.execute(
        "INSERT INTO outbox.orphaned_results (tenant_id, status, output, reason, source) "
        "VALUES (%s, 'ok', %s, 'fenced', 'relay') RETURNING id, output_ref",
        [TENANT, Jsonb(BODY)],
    ).fetchone()
    assert row is not None and row[1] == digest(json.dumps(BODY))
    return int(row[0])


def stored_unreferenced(db_url: str) -> str:
    """BODY stored, nothing referencing it (as after an erasure that has not swept yet)."""
    with psycopg.connect(db_url) as conn:
        conn.execute("DELETE FROM outbox.orphaned_results WHERE id = %s", [orphan_row(conn)])
    assert unreferenced(db_url) == [digest(json.dumps(BODY))]
    return digest(json.dumps(BODY))


def sweep(conn: psycopg.Connection[Any], body: str) -> int:
    return int(one(conn, "SELECT outbox.sweep_payloads_v1(%s)", [[body]]))


def waiting_on_a_lock(db_url: str, pid: int) -> bool:
    return bool(
        scalar(
            db_url, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
        )
    )


def test_a_sweep_passes_over_a_body_another_transaction_is_referencing(db_url):
    body = stored_unreferenced(db_url)
    with psycopg.connect(db_url) as inserter, psycopg.connect(db_url, autocommit=True) as sweeper:
        kept = orphan_row(inserter)  # not committed: the body is locked KEY SHARE
        assert sweep(sweeper, body) == 0  # passed over at once, not waited on
        inserter.commit()
        assert sweep(sweeper, body) == 0  # referenced now
    assert rows(db_url, "SELECT output_ref FROM outbox.orphaned_results WHERE id = %s", [kept]) == [
        (body,)
    ]
    assert body in payload_digests(db_url)


def test_a_reference_taken_while_a_sweep_deletes_the_body_stores_it_again(db_url):
    body = stored_unreferenced(db_url)
    with psycopg.connect(db_url) as sweeper, psycopg.connect(db_url) as inserter:
        assert sweep(sweeper, body) == 1  # deleted, not committed: the row stays locked
        pid = inserter.info.backend_pid
        made: list[int] = []
        failed: list[BaseException] = []

        def insert() -> None:
            try:
                made.append(orphan_row(inserter))
                inserter.commit()
            except BaseException as err:  # reported below
                failed.append(err)

        worker = threading.Thread(target=insert)
        worker.start()
        wait_until(lambda: waiting_on_a_lock(db_url, pid), what="the insert to wait on the sweep")
        sweeper.commit()
        worker.join(timeout=30)
        assert not worker.is_alive() and failed == []
    [ref] = made
    assert rows(db_url, "SELECT output_ref FROM outbox.orphaned_results WHERE id = %s", [ref]) == [
        (body,)
    ]
    assert body in payload_digests(db_url)


def test_sweeps_hammering_inserts_of_the_same_body_never_break_a_reference(db_url):
    """Two connections, one referencing and dropping the same body in a loop, one sweeping
    it in a loop: every insert succeeds, no reference is ever left without its body (the
    foreign key would refuse it), and the last sweep leaves nothing behind."""
    body = stored_unreferenced(db_url)
    stop = threading.Event()
    swept: list[int] = []
    failed: list[BaseException] = []

    def sweeping() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                while not stop.is_set():
                    swept.append(sweep(conn, body))
        except BaseException as err:  # reported below
            failed.append(err)

    worker = threading.Thread(target=sweeping)
    worker.start()
    try:
        with psycopg.connect(db_url) as conn:
            for _ in range(150):
                ref = orphan_row(conn)
                conn.commit()
                assert conn.execute(
                    "SELECT count(*) FROM outbox.payloads p JOIN outbox.orphaned_results o "
                    "ON o.output_ref = p.digest AND o.tenant_id = p.tenant_id WHERE o.id = %s",
                    [ref],
                ).fetchone() == (1,)
                conn.execute("DELETE FROM outbox.orphaned_results WHERE id = %s", [ref])
                conn.commit()
    finally:
        stop.set()
        worker.join(timeout=30)
    assert failed == []
    assert sum(swept) > 0, "the sweeper never deleted the body: the race was not run"
    with psycopg.connect(db_url, autocommit=True) as conn:
        sweep(conn, body)
    assert unreferenced(db_url) == [] and payload_digests(db_url) == set()


# -- outbox serve --------------------------------------------------------------------------

REVIEW_TOOL = {
    "type": "function",
    "name": "review",
    "description": "A person reviews a long text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def test_outbox_serve_shows_large_bodies_whole(sdk, relay, model, db_url):
    """A client function call with large arguments and its large output, through the
    Responses protocol: the caller sees the arguments whole (created and retrieved), the
    model sees the output whole, and both were stored by reference."""
    text = big("serve-arguments")
    verdict = big("serve-output")
    seen: list[str] = []

    def after(items: list[HistoryItem]) -> dict[str, str]:
        seen.extend(i.text for i in items if i.kind == "tool_output")
        return {"text": "reviewed"}

    model.add_script(
        "review", [{"tool_calls": [{"name": "review", "arguments": {"text": text}}]}, after]
    )
    asked = sdk.responses.create(model="scripted-1", input="script:review", tools=[REVIEW_TOOL])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    assert json.loads(call.arguments) == {"text": text}
    assert scalar(db_url, "SELECT arguments_ref IS NOT NULL FROM outbox.tool_calls")
    again = sdk.responses.retrieve(asked.id)
    assert again.model_dump() == asked.model_dump()
    done = sdk.responses.create(
        model="scripted-1",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": verdict}],
    )
    assert (done.status, done.output_text) == ("completed", "reviewed")
    assert seen == [verdict]
    assert scalar(db_url, "SELECT content_ref IS NOT NULL FROM outbox.messages WHERE role = 'tool'")


def test_erasure_racing_a_new_reference_to_the_same_body_keeps_it(conn, db_url):
    """A thread is erased while another transaction, not committed yet, references the same
    body: the erasure removes its own references and passes over the body, which the other
    transaction then commits a reference to."""
    add_tool(conn)
    erased = conversation(conn, BODY)
    body = digest(json.dumps(BODY))
    with psycopg.connect(db_url) as other:
        kept = orphan_row(other)  # references the body, not committed
        detail = retention.erase_thread(conn, erased.thread_id, actor="dpo@acme")
        conn.commit()
        assert detail["payloads"] == 1  # the thread's own arguments; the shared body stays
        assert body in payload_digests(db_url)
        other.commit()
    assert rows(db_url, "SELECT output_ref FROM outbox.orphaned_results WHERE id = %s", [kept]) == [
        (body,)
    ]
    assert unreferenced(db_url) == []
