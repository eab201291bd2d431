"""Requests waiting on a run wake from the run's own notification: a waiting
``responses.create`` and a ``stream=true`` reader answer once the run's last commit is told
over ``LISTEN outbox_runs``, though their poll is set to ten minutes here (a server that
only polled would answer past the client's deadline); with ``listen=False`` (poolers in
transaction mode) the poll still answers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import openai
import psycopg
import pytest

from outbox import lifecycle
from outbox.server import response_stream, responses, streaming
from outbox.server.wakeups import Wakeups
from tests import serve_harness
from tests.serve_harness import serve

pytestmark = [  # the SDK marks beta.assistants and beta.threads deprecated
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:The Assistants API is deprecated:DeprecationWarning"),
]
NEVER_S = 600.0  # a poll so slow that only a notification can answer within the deadline
DEADLINE_S = 30.0  # seconds the client waits for its answer


def client(url: str, key: str) -> openai.OpenAI:
    return serve_harness.client(url, key, timeout=DEADLINE_S)


def end_run_when_waited_on(db_url: str, waiting: Callable[[], Any]) -> Any:
    """Call ``waiting`` (a request that waits on a new run), cancel that run once it
    exists (its last commit), and return what the request answered."""
    with ThreadPoolExecutor(1) as pool:
        answer: Future[Any] = pool.submit(waiting)
        run_id = _new_run(db_url, answer)
        with psycopg.connect(db_url) as conn:
            lifecycle.cancel_run(conn, run_id, "acme", actor="test")
            conn.commit()
        return answer.result(timeout=DEADLINE_S + 5)


def _new_run(db_url: str, answer: Future[Any]) -> uuid.UUID:
    deadline = time.monotonic() + DEADLINE_S
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline and not answer.done():
            row = conn.execute("SELECT id FROM outbox.runs WHERE tenant_id = 'acme'").fetchone()
            if row is not None:
                return uuid.UUID(str(row[0]))
            time.sleep(0.02)  # polling interval of a condition with a deadline
    answer.result(timeout=0)  # the request's own error, if it failed
    raise AssertionError("no run was started")


def test_a_waiting_response_answers_on_the_runs_notification(db_url, api_key, monkeypatch):
    monkeypatch.setattr(response_stream, "POLL_S", (NEVER_S, NEVER_S))
    with serve(db_url) as url, client(url, api_key) as sdk:
        shown = end_run_when_waited_on(
            db_url, lambda: sdk.responses.create(model="scripted-1", input="hello")
        )
    assert shown.status == "cancelled"


def test_a_run_stream_ends_on_the_runs_notification(db_url, api_key, monkeypatch):
    monkeypatch.setattr(streaming, "POLL_S", NEVER_S)
    with serve(db_url) as url, client(url, api_key) as sdk:
        assistant = sdk.beta.assistants.create(model="scripted-1")

        def follow() -> list[str]:
            stream = sdk.beta.threads.create_and_run(
                assistant_id=assistant.id,
                thread={"messages": [{"role": "user", "content": "hello"}]},
                stream=True,
            )
            return [event.event for event in stream]

        events = end_run_when_waited_on(db_url, follow)
    assert events[-1] == "thread.run.cancelled"


def test_without_listen_waiting_requests_poll(db_url, api_key, monkeypatch):
    monkeypatch.setattr(response_stream, "POLL_S", (0.05, 0.2))
    with serve(db_url, listen=False) as url, client(url, api_key) as sdk:
        shown = end_run_when_waited_on(
            db_url, lambda: sdk.responses.create(model="scripted-1", input="hello")
        )
    assert shown.status == "cancelled"


def test_many_waiters_of_one_process_share_one_listening_connection(db_url, api_key):
    with serve(db_url) as url, client(url, api_key) as sdk:
        done = threading.Event()

        def wait() -> Any:
            try:
                return sdk.responses.create(model="scripted-1", input="hello")
            finally:
                done.set()

        end_run_when_waited_on(db_url, wait)
        with psycopg.connect(db_url, autocommit=True) as conn:
            listening = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN outbox_runs'"
                " AND datname = current_database()"
            ).fetchone()
    assert done.is_set() and listening == (1,)


def test_a_streamed_response_ends_on_the_runs_notification(db_url, api_key, monkeypatch):
    monkeypatch.setattr(response_stream, "POLL_S", (NEVER_S, NEVER_S))
    with serve(db_url) as url, client(url, api_key) as sdk:

        def follow() -> list[str]:
            stream = sdk.responses.create(model="scripted-1", input="hello", stream=True)
            return [event.type for event in stream]

        kinds = end_run_when_waited_on(db_url, follow)
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"


LISTENERS = (
    "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN outbox_runs'"
    " AND datname = current_database()"
)


def _listener(db_url: str, other_than: int | None = None) -> int:
    """The server's listening backend (another than ``other_than``), once there is one."""
    deadline = time.monotonic() + DEADLINE_S
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            pids = [row[0] for row in conn.execute(LISTENERS) if row[0] != other_than]
            if pids:
                return int(pids[0])
            time.sleep(0.02)  # polling interval of a condition with a deadline
    raise AssertionError("the server does not listen")


def test_the_listener_connects_again_after_its_connection_is_cut(db_url, api_key, monkeypatch):
    monkeypatch.setattr(response_stream, "POLL_S", (NEVER_S, NEVER_S))
    with serve(db_url) as url, client(url, api_key) as sdk:
        first = _listener(db_url)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        _listener(db_url, other_than=first)
        shown = end_run_when_waited_on(
            db_url, lambda: sdk.responses.create(model="scripted-1", input="hello")
        )
    assert shown.status == "cancelled"


def test_a_watch_placed_after_its_runs_notification_is_woken_by_it(db_url):
    """A waiting create reads its response only once the run changed (its watch is
    ``primed``): a notification of its run that reached the process between the create's
    commit and the watch still wakes it; a watch is primed only when the listener was
    connected throughout (``Wakeups.mark`` before the create)."""

    async def check() -> None:
        hub = Wakeups(db_url)
        await hub.start()
        try:
            await _until(lambda: hub.listening)
            settled, running, unknown = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            mark = hub.mark()
            assert mark is not None
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
                for run, status in ((running, "in_progress"), (settled, "completed")):
                    payload = json.dumps({"run_id": str(run), "status": status})
                    await conn.execute("SELECT pg_notify('outbox_runs', %s)", [payload])
            await _until(lambda: settled in hub.recent and running in hub.recent)
            quiet = response_stream.UNSETTLING
            with hub.watch(settled, quiet, since=mark) as watch:
                assert watch.primed and watch.flag.is_set()  # settled before the watch
            with hub.watch(running, quiet, since=mark) as watch:
                assert watch.primed and not watch.flag.is_set()  # a quiet status
            with hub.watch(unknown, quiet, since=mark) as watch:
                assert watch.primed and not watch.flag.is_set()  # nothing told yet
            with hub.watch(settled, quiet) as watch:
                assert not watch.primed  # no mark: reads first
            hub.wake(None)  # a notification that names no run: marks before it are spent
            with hub.watch(unknown, quiet, since=mark) as watch:
                assert not watch.primed
        finally:
            await hub.stop()

    asyncio.run(check())


async def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)  # polling interval of a condition with a deadline


def test_a_waiting_response_reads_its_response_only_once_its_run_settled(
    db_url, api_key, monkeypatch
):
    """The primed watch of a waiting create: one read of the response, after the run's
    settling notification (none before it, none on the fallback poll)."""
    monkeypatch.setattr(response_stream, "POLL_S", (NEVER_S, NEVER_S))
    monkeypatch.setattr(response_stream, "FALLBACK_S", NEVER_S)
    reads: list[str] = []
    shown = responses.get_settled

    def counted(*args: Any, **options: Any) -> Any:
        answers = shown(*args, **options)
        reads.extend(answer["status"] for answer in answers.values())
        return answers

    monkeypatch.setattr(responses, "get_settled", counted)
    with serve(db_url) as url, client(url, api_key) as sdk:
        answered = end_run_when_waited_on(
            db_url, lambda: sdk.responses.create(model="scripted-1", input="hello")
        )
    assert answered.status == "cancelled"
    assert reads == ["cancelled"]
