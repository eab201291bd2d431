"""An Idempotency-Key covers the whole request: the same body again returns the
first request's run, for runs and create-and-run alike; the key with any other body is a
409 naming the key, and stores nothing."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import psycopg
import pytest

from outbox.server import idempotency
from outbox.server.errors import APIError

pytestmark = [  # the SDK marks beta.assistants and beta.threads deprecated
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]


def stored(db_url: str) -> tuple[int, int, int]:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.threads), (SELECT count(*) FROM outbox.runs),"
            " (SELECT count(*) FROM outbox.messages)"
        ).fetchone()
    assert row is not None
    return row


def test_a_resend_must_repeat_the_whole_run_request(db_url, sdk):
    assistant = sdk.beta.assistants.create(model="scripted-1")
    thread = sdk.beta.threads.create()
    extra = [{"role": "user", "content": "hello"}]

    def create(key: str, **fields: object) -> object:
        return sdk.beta.threads.runs.create(
            thread_id=thread.id,
            assistant_id=assistant.id,
            additional_messages=extra,  # type: ignore[arg-type]
            extra_headers={"Idempotency-Key": key},
            **fields,  # type: ignore[arg-type]
        )

    first = create("req-1", instructions="be brief")
    assert create("req-1", instructions="be brief").id == first.id  # type: ignore[attr-defined]
    before = stored(db_url)
    with pytest.raises(openai.ConflictError, match="Idempotency-Key 'req-1' was already used"):
        create("req-1", instructions="be long")
    with pytest.raises(openai.ConflictError, match="'req-1'"):
        create("req-1", instructions="be brief", metadata={"a": "b"})
    assert stored(db_url) == before  # nothing of the refused resends


def test_a_resend_of_create_and_run_returns_the_first_thread_and_run(db_url, sdk):
    assistant = sdk.beta.assistants.create(model="scripted-1")

    def create(text: str) -> object:
        return sdk.beta.threads.create_and_run(
            assistant_id=assistant.id,
            thread={"messages": [{"role": "user", "content": text}]},
            extra_headers={"Idempotency-Key": "req-2"},
        )

    first, again = create("refund 42"), create("refund 42")
    assert (again.id, again.thread_id) == (first.id, first.thread_id)  # type: ignore[attr-defined]
    before = stored(db_url)
    with pytest.raises(openai.ConflictError, match="'req-2'"):
        create("refund 43")
    assert stored(db_url) == before == (1, 1, 1)


def test_a_resend_must_repeat_the_whole_response_request(db_url, sdk):
    def create(key: str, text: str, **fields: object) -> object:
        return sdk.responses.create(
            model="scripted-1",
            input=text,
            background=True,  # answered at once: no relay runs here
            extra_headers={"Idempotency-Key": key},
            **fields,  # type: ignore[arg-type]
        )

    first = create("resp-1", "refund 42")
    assert create("resp-1", "refund 42").id == first.id  # type: ignore[attr-defined]
    before = stored(db_url)
    with pytest.raises(openai.ConflictError, match="Idempotency-Key 'resp-1' was already used"):
        create("resp-1", "refund 43")
    with pytest.raises(openai.ConflictError, match="'resp-1'"):
        create("resp-1", "refund 42", metadata={"a": "b"})
    with pytest.raises(openai.ConflictError, match="'resp-1'"):  # a key is one request
        sdk.beta.threads.create_and_run(
            assistant_id=sdk.beta.assistants.create(model="scripted-1").id,
            extra_headers={"Idempotency-Key": "resp-1"},
        )
    assert stored(db_url) == before == (1, 1, 1)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.responses").fetchone() == (1,)


def test_a_resend_must_repeat_the_whole_message_request(db_url, sdk):
    thread = sdk.beta.threads.create()

    def create(key: str, text: str, thread_id: str = thread.id) -> object:
        return sdk.beta.threads.messages.create(
            thread_id=thread_id, role="user", content=text, extra_headers={"Idempotency-Key": key}
        )

    first = create("msg-1", "hello")
    assert create("msg-1", "hello").id == first.id  # type: ignore[attr-defined]
    before = stored(db_url)
    with pytest.raises(openai.ConflictError, match="Idempotency-Key 'msg-1' was already used"):
        create("msg-1", "hello!")
    with pytest.raises(openai.ConflictError, match="'msg-1'"):  # the same body, another thread
        create("msg-1", "hello", sdk.beta.threads.create().id)
    assert stored(db_url) == (before[0] + 1, before[1], before[2])  # only the second thread


TWINS = 8  # pairs of twins: each pair races once; before the fix some pairs got a 409


def test_twins_sent_at_the_same_moment_get_the_same_thread_and_run(db_url, sdk):
    assistant = sdk.beta.assistants.create(model="scripted-1")
    gate = threading.Barrier(2 * TWINS)

    def create(key: str) -> tuple[str, str]:
        gate.wait(timeout=30)  # every request leaves together
        run = sdk.beta.threads.create_and_run(
            assistant_id=assistant.id,
            thread={"messages": [{"role": "user", "content": f"twin {key}"}]},
            extra_headers={"Idempotency-Key": key},
        )
        return run.id, run.thread_id

    with ThreadPoolExecutor(2 * TWINS) as pool:
        answers = [
            (pool.submit(create, f"twin-{n}"), pool.submit(create, f"twin-{n}"))
            for n in range(TWINS)
        ]
        pairs = [(a.result(timeout=60), b.result(timeout=60)) for a, b in answers]
    assert all(a == b for a, b in pairs)
    assert stored(db_url) == (TWINS, TWINS, TWINS)  # one thread, run and message per key


def test_response_twins_sent_at_the_same_moment_get_the_same_response(db_url, sdk):
    gate = threading.Barrier(2 * TWINS)

    def create(key: str) -> str:
        gate.wait(timeout=30)  # every request leaves together
        made = sdk.responses.create(
            model="scripted-1",
            input=f"twin {key}",
            background=True,  # answered at once: no relay runs here
            extra_headers={"Idempotency-Key": key},
        )
        return made.id

    with ThreadPoolExecutor(2 * TWINS) as pool:
        answers = [
            (pool.submit(create, f"rtwin-{n}"), pool.submit(create, f"rtwin-{n}"))
            for n in range(TWINS)
        ]
        pairs = [(a.result(timeout=60), b.result(timeout=60)) for a, b in answers]
    assert all(a == b for a, b in pairs)
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.responses").fetchone() == (TWINS,)
    assert stored(db_url) == (TWINS, TWINS, TWINS)


def test_a_refusal_the_database_could_not_make_durable_is_a_503(db_url, sdk, monkeypatch):
    """A refusal is answered only once what it rests on is durable (server/db_pool.py): the
    refused request rolls back, then commits ``durable_reads``. When the database goes away
    in between, the answer is a 503 the client sends again, never the 409, which could
    rest on a create that a crash then loses. Here the server's backends are terminated
    right as the 409 is decided (its connection among them)."""
    first = sdk.responses.create(
        model="scripted-1",
        input="refund 42",
        background=True,  # answered at once: no relay runs here
        extra_headers={"Idempotency-Key": "cut-1"},
    )
    refuse = idempotency.reused
    cut: list[int] = []

    def database_goes_away(key: str) -> APIError:
        with psycopg.connect(db_url, autocommit=True) as conn:
            others = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
            for (pid,) in others:  # each gone when this returns true
                if conn.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone():
                    cut.append(pid)
        return refuse(key)

    monkeypatch.setattr(idempotency, "reused", database_goes_away)
    with pytest.raises(openai.InternalServerError) as refused:
        sdk.responses.create(
            model="scripted-1",
            input="refund 43",
            background=True,
            extra_headers={"Idempotency-Key": "cut-1"},
        )
    assert cut, "no backend of the server was terminated"
    assert refused.value.status_code == 503
    assert refused.value.code == "database_unavailable"
    monkeypatch.setattr(idempotency, "reused", refuse)
    with pytest.raises(openai.ConflictError, match="'cut-1'"):  # sent again: the 409 now
        sdk.responses.create(
            model="scripted-1",
            input="refund 43",
            background=True,
            extra_headers={"Idempotency-Key": "cut-1"},
        )
    assert sdk.responses.retrieve(first.id).id == first.id


def test_a_request_meeting_the_database_gone_is_a_503_and_sent_again_is_stored_once(db_url, sdk):
    """Every backend of the server is terminated between two requests (the pool's idle
    connections with them): the next request meets a dropped connection. Its answer is a
    503 the SDK sends again by itself, never a 500; sent again with the same key, it is
    stored once."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        others = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
        assert others, "the server holds no connection"
        for (pid,) in others:
            assert conn.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()
    ask = {"model": "scripted-1", "input": "refund 44", "background": True}
    with pytest.raises(openai.InternalServerError) as gone:
        sdk.responses.create(**ask, extra_headers={"Idempotency-Key": "gone-1"})
    assert gone.value.status_code == 503
    assert gone.value.code == "database_unavailable"
    assert "Idempotency-Key" in gone.value.message
    assert gone.value.response.headers["Retry-After"] == "1"
    first = sdk.with_options(max_retries=5).responses.create(
        **ask, extra_headers={"Idempotency-Key": "gone-1"}
    )
    again = sdk.responses.create(**ask, extra_headers={"Idempotency-Key": "gone-1"})
    assert again.id == first.id
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox.responses").fetchone() == (1,)
