"""Answers that PostgreSQL or Python cannot take as they are: decided at the edge, once.

A tool that answers 200 with JSON holding a NUL character, ``NaN``, a number beyond a
float's range or nesting 100,000 deep has answered: the call gets a terminal error result
that names the problem (the model sees it and the run goes on), the tool is never called
again for it (for a ``none`` tool a second call is a second effect), and nothing is taken
for a database outage. A python tool returning such a value is the same. Whatever slips
past the edges and is refused by PostgreSQL itself (a data error: 22P05, 22P02, 54001)
becomes the same error result in the completer, beside the other outcomes of its
transaction, never a lease left to run out. The library's edges (client tool outputs,
model arguments, text) refuse it naming it. A model's answer that cannot be stored fails
its run at once; one over the cap of a model answer is read no further, retried, and
fails its run naming the cap when out of attempts (docs/relay.md, "Answers the database
cannot take").
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import db, lifecycle, registry, writer
from outbox.errors import InvalidInput
from outbox.relay import links
from outbox.relay.outcomes import Outcome
from outbox.relay.worker import Worker
from outbox.schemas import StartRun
from outbox.storable import NotStorable
from outbox.testing.server import FakeServer, Reply, Request
from outbox.testing.tools import FakeToolService
from tests.helpers import TENANT, add_tool, new_run, turn
from tests.relay_harness import (
    all_settled,
    config,
    register_tool,
    relay_thread,
    scalar,
    seed,
    tool_call_states,
    wait_until,
)

DEEP = b"[" * 100_000 + b"]" * 100_000
ANSWERS = {
    "nul": (b'{"note": "a\\u0000b"}', "it holds a NUL character (\\u0000) at $.note"),
    "nan": (b'{"score": NaN}', "it holds NaN, which JSON does not allow"),
    "huge": (b'{"n": 1e400}', "it holds the number 1e400, beyond a float's range"),
    "surrogate": (b'{"s": "\\udc00"}', "it holds a lone surrogate (\\udc00) at $.s"),
    "deep": (DEEP, "it is nested more than 128 levels deep"),
}


@pytest.fixture
def service() -> Iterator[FakeToolService]:
    with FakeToolService(standard_tools=False) as svc:
        svc.add_tool("blind", "none")
        yield svc


@pytest.fixture
def outages(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What the relay logs as a database outage or a crashed executor (should be nothing)."""
    caplog.set_level(logging.WARNING, logger="relay")

    class Records(list[logging.LogRecord]):
        def __iter__(self) -> Iterator[logging.LogRecord]:
            return iter(
                r
                for r in caplog.records
                if r.getMessage() in ("db.unavailable", "executor.crashed", "complete.failed")
            )

    return Records()


def tool_message_error(db_url: str) -> str:
    """The error of the tool message the model will see (its content is JSON)."""
    content = scalar(db_url, "SELECT content FROM outbox.messages WHERE role = 'tool'")
    return str(json.loads(content)["error"])


def next_turn_enqueued(db_url: str) -> bool:
    """The batch was delivered and the run's next model turn is waiting: the run goes on."""
    return bool(
        scalar(
            db_url,
            "SELECT count(*) FROM outbox.outbox o JOIN outbox.submissions s "
            "ON s.run_id = o.run_id WHERE o.kind = 'model_turn' AND o.payload->>'step_no' = '2'",
        )
    )


@pytest.mark.parametrize("kind", ANSWERS)
def test_a_tool_answer_that_cannot_be_stored_is_an_error_result_and_never_a_second_call(
    db_url, service, outages, kind
):
    body, problem = ANSWERS[kind]
    with psycopg.connect(db_url) as conn:
        register_tool(conn, service, "blind", "none")
        conn.commit()
    service.tool("blind").answer_raw(body, n=None)  # every call would answer the same
    seed(db_url, ["blind"], runs=1, calls_per_batch=1, args=lambda n: {"n": n})
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to settle")
        wait_until(lambda: next_turn_enqueued(db_url), what="the batch to be delivered")
    assert len(service.tool("blind").deliveries) == 1  # called once: it answered
    assert tool_call_states(db_url) == {"failed": 1}
    error = str(scalar(db_url, "SELECT error FROM outbox.tool_results"))
    assert error.startswith("tool result is not storable JSON: ")
    assert problem in error
    assert tool_message_error(db_url) == error  # what the model sees on its next turn
    assert list(outages) == []


@pytest.mark.parametrize("kind", ["nul", "nan", "surrogate", "deep"])
@pytest.mark.parametrize("mode", ["none", "key"])
def test_a_python_tool_returning_what_cannot_be_stored_is_an_error_result(
    db_url, tmp_path: Path, outages, kind, mode
):
    calls = tmp_path / "calls"
    with psycopg.connect(db_url) as conn:
        spec = registry.ToolSpec(
            name="py",
            executor="python",
            callable="tests.tooling:unstorable",
            idempotency_mode=mode,
        )
        registry.register(conn, spec)
        conn.commit()
    seed(
        db_url, ["py"], runs=1, calls_per_batch=1, args=lambda n: {"kind": kind, "path": str(calls)}
    )
    with relay_thread(db_url):
        wait_until(lambda: all_settled(db_url), what="the call to settle")
        wait_until(lambda: next_turn_enqueued(db_url), what="the batch to be delivered")
    assert calls.read_text().splitlines() == ["ran"]
    assert tool_call_states(db_url) == {"failed": 1}
    error = str(scalar(db_url, "SELECT error FROM outbox.tool_results"))
    assert error.startswith("tool result is not storable JSON: ")
    assert list(outages) == []


def test_a_result_postgresql_refuses_becomes_an_error_result_and_the_others_are_written(
    db_url, outages
):
    """Past the edges (here: outcomes made by hand), a result PostgreSQL refuses (22P05)
    fails the transaction it shares; written alone it is refused again, and becomes an
    error result naming the refusal. Its neighbour is written; nothing is an outage."""
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn, registry.ToolSpec(name="t", executor="http", endpoint="http://127.0.0.1:9/t")
        )
        conn.commit()
    seed(db_url, ["t"], runs=1, calls_per_batch=2, args=lambda n: {"n": n})
    worker = Worker(config(db_url))
    link = worker.claim_link()
    bad, good = worker._claim(link, 10)
    link.close()
    outcomes = worker.outcomes[0]
    outcomes.put(Outcome(bad, "result", "ok", {"note": "a\x00b"}))
    outcomes.put(Outcome(good, "result", "ok", {"fine": True}))
    completer = threading.Thread(target=worker.completer.loop, args=(outcomes,))
    completer.start()
    outcomes.join()
    worker.done.set()
    completer.join(timeout=10)
    rows = "SELECT tool_call_ref, status, output, error FROM outbox.tool_results ORDER BY 1"
    with psycopg.connect(db_url) as conn:
        (_, bad_status, _, bad_error), (_, good_status, good_output, _) = conn.execute(
            rows
        ).fetchall()
    assert (good_status, good_output) == ("ok", {"fine": True})
    assert bad_status == "error"
    assert bad_error.startswith("tool result could not be stored: PostgreSQL refused it")
    assert "22P05" in bad_error
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'tool_call'") == 0
    assert list(outages) == []


def test_a_turn_postgresql_refuses_fails_its_run_and_the_others_are_recorded(db_url, outages):
    with psycopg.connect(db_url) as conn:
        add_tool(conn)
        runs = [new_run(conn, tools=["lookup_order"]) for _ in range(2)]
        conn.commit()
    worker = Worker(config(db_url, kinds=("model_turn",)))
    link = worker.claim_link()
    claimed = {row.run_id: row for row in worker._claim(link, 10)}
    link.close()
    outcomes = worker.outcomes[0]
    for i, run in enumerate(runs):
        answer = turn(run, 1, text="fine")
        if i == 0:  # what no edge lets through any more: a NUL in the assistant's text
            answer = answer.model_copy(update={"content": "a\x00b"})
        outcomes.put(Outcome(claimed[run.id], "turn", output=answer))
    completer = threading.Thread(target=worker.completer.loop, args=(outcomes,))
    completer.start()
    outcomes.join()
    worker.done.set()
    completer.join(timeout=10)
    status = "SELECT status, failure_reason, last_error FROM outbox.runs WHERE id = %s"
    with psycopg.connect(db_url) as conn:
        failed = conn.execute(status, [runs[0].id]).fetchone()
        fine = conn.execute(status, [runs[1].id]).fetchone()
    assert fine[0] == "completed"
    assert failed[:2] == ("failed", "model_error")
    assert "model answer could not be recorded: PostgreSQL refused it" in failed[2]
    assert scalar(db_url, "SELECT count(*) FROM outbox.outbox WHERE kind = 'model_turn'") == 0
    assert list(outages) == []


@pytest.mark.parametrize(
    "literal,sqlstate",
    [
        ('\'{"a": "\\u0000"}\'', "22P05"),
        ("'NaN'", "22P02"),
        ("repeat('[', 100000) || repeat(']', 100000)", "54001"),
    ],
)
def test_a_refused_statement_is_not_an_outage_and_the_link_stays_open(db_url, literal, sqlstate):
    link = links.Link(db_url, "test")
    conn = link.get()
    with pytest.raises(psycopg.Error) as err:
        conn.execute(f"SELECT ({literal})::jsonb")
    conn.rollback()
    assert err.value.sqlstate == sqlstate
    assert db.refused(err.value) and not db.unreachable(err.value)
    assert not link.outage(err.value)
    assert link.get() is conn and conn.execute("SELECT 1").fetchone() == (1,)
    link.close()


# -- the library's edges: client tool outputs, model turns, the SQL API ------------------


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture
def waiting(conn: psycopg.Connection[Any]) -> writer.RunRef:
    """A run waiting (``requires_action``) for the output of client tool call ``c1``."""
    registry.register(
        conn, registry.ToolSpec(name="approve", executor="client", json_schema={"type": "object"})
    )
    run = new_run(conn, tools=["approve"])
    writer.record_model_turn(conn, turn(run, 1, ("c1", "approve", {})))
    conn.commit()
    return run


@pytest.mark.parametrize(
    "output,problem",
    [
        ({"note": "a\x00b"}, "NUL character (\\u0000) at $.output.note"),
        (float("nan"), "NaN at $.output"),
        ("\udc00", "lone surrogate (\\udc00) at $.output"),
        (nested(100_000), "nested more than 128 levels deep"),
    ],
)
def test_client_tool_outputs_that_cannot_be_stored_are_refused_storing_nothing(
    conn, waiting, output, problem
):
    with pytest.raises(NotStorable) as refused_:
        lifecycle.submit_tool_outputs(
            conn, TENANT, waiting.id, [{"tool_call_id": "c1", "output": output}]
        )
    assert isinstance(refused_.value, InvalidInput)
    assert str(refused_.value).startswith("output of c1 is not storable JSON: ")
    assert problem in str(refused_.value)
    # nothing was stored, and the caller's transaction is still usable
    fine = [{"tool_call_id": "c1", "output": {"approved": True}}]
    assert lifecycle.submit_tool_outputs(conn, TENANT, waiting.id, fine) == "in_progress"
    assert conn.execute("SELECT output FROM outbox.tool_results").fetchall() == [
        (fine[0]["output"],)
    ]


@pytest.mark.parametrize(
    "outputs,sqlstate",
    [
        ('[{"tool_call_id": "c1", "output": "a\\u0000b"}]', "22P05"),
        ('[{"tool_call_id": "c1", "output": NaN}]', "22P02"),
    ],
)
def test_the_sql_api_refuses_them_in_postgresql_itself(conn, waiting, outputs, sqlstate):
    """A backend without Python hands jsonb to the SQL API: PostgreSQL refuses what jsonb
    cannot hold before the function runs, naming it, and nothing is stored."""
    conn.execute("SET LOCAL ROLE outbox_writer")
    with pytest.raises(psycopg.Error) as err:
        conn.execute(
            "SELECT outbox.submit_tool_outputs_v1(%s, %s, %s::jsonb)", [TENANT, waiting.id, outputs]
        )
    conn.rollback()
    assert err.value.sqlstate == sqlstate
    assert conn.execute("SELECT count(*) FROM outbox.tool_results").fetchone() == (0,)


@pytest.mark.parametrize(
    "arguments,problem",
    [
        ('{"order_id": "\\u0000"}', "it holds a NUL character (\\u0000) at $.order_id"),
        ('{"order_id": NaN}', "it holds NaN, which JSON does not allow"),
        ("[" * 100_000 + "]" * 100_000, "it is nested more than 128 levels deep"),
    ],
)
def test_model_arguments_that_cannot_be_stored_are_an_error_the_model_sees(
    conn, arguments, problem
):
    """Arguments are the model's text: what cannot be stored of them is the model's mistake,
    answered like arguments that are not JSON (the turn is recorded, the run goes on)."""
    add_tool(conn)
    run = new_run(conn, tools=["lookup_order"])
    record = writer.record_model_turn(conn, turn(run, 1, ("c1", "lookup_order", arguments)))
    error = conn.execute("SELECT error FROM outbox.tool_results").fetchone()[0]
    assert error.startswith("arguments for 'lookup_order' are not storable JSON: ")
    assert problem in error
    assert record.created


@pytest.mark.parametrize("text", ["a\x00b", "a\udc00"])
def test_text_postgresql_cannot_store_is_refused_naming_the_field(conn, text):
    run = new_run(conn)
    with pytest.raises(NotStorable, match="assistant message cannot be stored: it holds a"):
        turn(run, 1, text=text)
    fields = {"tenant_id": TENANT, "thread_id": uuid.uuid4(), "model": "m"}
    with pytest.raises(NotStorable, match="message cannot be stored: it holds a"):
        StartRun(**fields, message=text)
    with pytest.raises(NotStorable, match="instructions cannot be stored: it holds a"):
        StartRun(**fields, instructions=text)


# -- model answers: over the cap, or JSON PostgreSQL cannot store ---------------------------


class RawModel(FakeServer):
    """A model server that answers every request 200 with ``body`` as it is."""

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body
        self.requests = 0

    def handle(self, request: Request) -> Reply:
        with self.lock:
            self.requests += 1
        return Reply(200, self.body)


@contextlib.contextmanager
def endless_model() -> Iterator[tuple[str, list[int]]]:
    """A model server answering 200 with a chunked body that never ends: its base URL, and
    the bytes it sent on each request (it feeds a connection until the client hangs up)."""
    listener = socket.create_server(("127.0.0.1", 0))
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    chunk = b"4000\r\n" + b" " * 0x4000 + b"\r\n"
    sent: list[int] = []

    def feed(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            sent.append(0)
            i = len(sent) - 1
            conn.sendall(head)
            while True:
                conn.sendall(chunk)
                sent[i] += len(chunk)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=feed, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", sent
    finally:
        listener.close()


def start_run(db_url: str, base_url: str) -> uuid.UUID:
    with psycopg.connect(db_url) as conn:
        thread = writer.create_thread(conn, TENANT).id
        run = writer.start_run(
            conn,
            StartRun(
                tenant_id=TENANT, thread_id=thread, model="m", message="hi", base_url=base_url
            ),
        )
        conn.commit()
    return run.id


def run_row(db_url: str, run_id: uuid.UUID) -> tuple[str, str | None, str | None]:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT status, failure_reason, last_error FROM outbox.runs WHERE id = %s", [run_id]
        ).fetchone()
    assert row is not None
    return row


def run_ended(db_url: str, run_id: uuid.UUID) -> bool:
    return run_row(db_url, run_id)[0] in ("completed", "failed")


def test_a_model_answer_over_the_cap_is_retried_then_fails_the_run_naming_the_cap(db_url, outages):
    cap = 64 * 1024
    with endless_model() as (url, sent):
        run_id = start_run(db_url, url)
        with relay_thread(db_url, kinds=("model_turn",), max_model_answer_bytes=cap):
            wait_until(lambda: run_ended(db_url, run_id), what="the run to end")
    status, reason, error = run_row(db_url, run_id)
    assert (status, reason) == ("failed", "model_error")
    assert error is not None
    assert f"the model answered over {cap} bytes, the cap of a model answer" in error
    assert "failed after 5 attempts" in error
    assert len(sent) == 5  # retried with backoff, then no more
    retried = "SELECT count(*) FROM outbox.journal WHERE event = 'model_turn.retry_scheduled'"
    assert scalar(db_url, retried) == 4
    # The relay read up to the cap and hung up: what the server got out is the cap plus
    # the sockets' buffers, not an endless answer.
    assert max(sent) < 32 * 1024 * 1024
    assert list(outages) == []


@pytest.mark.parametrize(
    "body,problem",
    [
        (
            json.dumps(
                {
                    "id": "r",
                    "output": [
                        {"type": "message", "content": [{"type": "output_text", "text": "a\x00b"}]}
                    ],
                }
            ).encode(),
            "it holds a NUL character (\\u0000) at $.output[0].content[0].text",
        ),
        (DEEP, "it is nested more than 128 levels deep"),
        (b'{"id": "r", "output": [], "usage": {"input_tokens": NaN}}', "it holds NaN"),
    ],
    ids=["nul", "deep", "nan"],
)
def test_a_model_answer_that_cannot_be_stored_fails_the_run_once_naming_it(
    db_url, outages, body, problem
):
    with RawModel(body) as model:
        run_id = start_run(db_url, model.url + "/v1")
        with relay_thread(db_url, kinds=("model_turn",)):
            wait_until(lambda: run_ended(db_url, run_id), what="the run to end")
    status, reason, error = run_row(db_url, run_id)
    assert (status, reason) == ("failed", "model_error")
    assert error is not None
    assert error.startswith(
        "model response cannot be recorded: the model's answer is not storable JSON: "
    )
    assert problem in error
    assert model.requests == 1  # an answer that arrived is not asked for again
    assert list(outages) == []
