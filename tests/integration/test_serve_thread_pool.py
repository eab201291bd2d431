"""The server runs its handlers' database calls on one thread per database connection
(server.thread_pool), all its connections but its LISTEN one: more requests than connections
wait their turn and are all answered, on no more connections than it was given;
a request that waited past the queue timeout before anything of it was done is refused
with a 503 and stored nothing, and one whose run exists is answered however long it
waits."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import openai
import psycopg
import pytest

from outbox.logs import JsonFormatter
from outbox.server import thread_pool
from outbox.server.app import create_app
from outbox.server.observed import REGISTRY
from tests.helpers import blocked_on_a_lock, in_thread, server_logs
from tests.relay_harness import relay_thread, scalar, wait_until
from tests.serve_harness import ALL_KINDS, TENANTS, client, serve


def test_twenty_waiting_requests_on_three_connections_are_answered_by_two_threads(
    db_url, model, api_keys, relay
):
    # Three connections: two for the requests' calls, one to LISTEN; never more.
    named = db_url + ("&" if "?" in db_url else "?") + "application_name=serve-under-test"
    held = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'serve-under-test'"
    with serve(named, model_base_url=model.url + "/v1", max_connections=3) as url:
        with client(url, api_keys[TENANTS[0]], timeout=60) as sdk:

            def ask(i: int) -> str:
                return sdk.responses.create(model="scripted", input=f"hello {i}").output_text

            with ThreadPoolExecutor(20) as asking:
                answers = list(asking.map(ask, range(20)))
            # The pool keeps the connections it opened for the burst: the most it held.
            assert scalar(db_url, held) == 3
        pool = thread_pool._pool
        assert answers == ["hello"] * 20
        assert pool._max_workers == 2
        assert 1 <= len(pool._threads) <= 2


def test_a_server_process_needs_a_connection_for_requests_beside_its_listener(db_url):
    with pytest.raises(ValueError, match=r"1 are too few: .* needs 2 .* or 1 with --no-listen"):
        create_app(db_url, max_connections=1)
    create_app(db_url, max_connections=1, listen=False)  # polls: its one is for requests


# -- the queue's deadline: a request that waited too long is refused, having done nothing --


QUEUE_TIMEOUT_S = 0.2  # short: the test holds the one thread far longer than this


def queued_calls() -> float:
    return REGISTRY.get_sample_value("outbox_serve_queued_calls") or 0.0


def shed_requests() -> float:
    return REGISTRY.get_sample_value("outbox_serve_shed_requests_total") or 0.0


@contextmanager
def keys_locked(db_url: str) -> Iterator[None]:
    """Every look-up of an API key waits for the block to end: the server's one thread,
    taken by the first request that looks up its key, stays taken."""
    with psycopg.connect(db_url) as conn:
        conn.execute("LOCK TABLE outbox.api_keys IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def queued_past_the_timeout(what: str) -> None:
    """Wait until a call is queued, then until it has been queued past the timeout."""
    wait_until(lambda: queued_calls() >= 1, 20, what)
    seen = time.monotonic()  # the call was queued by now: it waits at least from here
    wait_until(lambda: time.monotonic() - seen > QUEUE_TIMEOUT_S * 2, 5, "the timeout")


@contextmanager
def one_thread(db_url: str, model: Any, api_keys: dict[str, str]) -> Iterator[openai.OpenAI]:
    """The openai SDK on a server with one connection (one thread) for its requests' calls
    and a short queue timeout."""
    options = {"max_connections": 2, "queue_timeout_s": QUEUE_TIMEOUT_S}
    with (
        serve(db_url, model_base_url=model.url + "/v1", **options) as url,
        client(url, api_keys[TENANTS[0]], timeout=60) as sdk,
    ):
        yield sdk


def runs(db_url: str) -> int:
    return int(scalar(db_url, "SELECT count(*) FROM outbox.runs"))


def test_a_request_queued_past_the_timeout_is_a_503_that_stored_nothing(db_url, model, api_keys):
    with one_thread(db_url, model, api_keys) as sdk:
        shed = shed_requests()

        def create(text: str) -> Any:
            return sdk.responses.create(model="scripted", input=text, background=True)

        with server_logs() as logged:
            with keys_locked(db_url):
                first, first_out = in_thread(lambda: create("first"))
                wait_until(lambda: blocked_on_a_lock(db_url), 20, "the first create to wait")
                second, second_out = in_thread(lambda: create("second"))
                queued_past_the_timeout("the second create to queue")
            first.join(30)
            second.join(30)
        assert first_out["result"].status == "queued"
        refused = second_out["error"]
        assert isinstance(refused, openai.APIStatusError)
        assert refused.status_code == 503
        assert refused.code == "server_busy"
        assert refused.response.headers["retry-after"] == "1"  # nothing queued behind it
        assert 1000 <= int(refused.response.headers["retry-after-ms"]) <= 2000
        assert "nothing of it was stored" in refused.message
        assert shed_requests() == shed + 1
        [line] = [json.loads(JsonFormatter().format(r)) for r in logged if r.msg == "api.shed"]
        assert line["waited_s"] > QUEUE_TIMEOUT_S and line["retry_after_s"] == 1.0
        assert line["correlation_id"].startswith("req_") and line["path"] == "/v1/responses"
        assert runs(db_url) == 1  # the first's only
        assert create("second").status == "queued"  # sent again, it is served
        assert runs(db_url) == 2


def test_a_request_whose_run_exists_is_answered_however_long_its_answer_queued(
    db_url, model, api_keys
):
    with one_thread(db_url, model, api_keys) as sdk:
        shed = shed_requests()
        waiting, answer = in_thread(
            lambda: sdk.responses.create(model="scripted", input="hi").output_text
        )
        wait_until(lambda: runs(db_url) == 1, 20, "the waiting create's run")
        with keys_locked(db_url):
            # Another request takes the one thread and keeps it.
            other, _ = in_thread(lambda: sdk.responses.retrieve("resp_" + "0" * 32))
            wait_until(lambda: blocked_on_a_lock(db_url), 20, "the other request to wait")
            with relay_thread(db_url, kinds=ALL_KINDS):
                ended = "SELECT count(*) FROM outbox.runs WHERE status = 'completed'"
                wait_until(lambda: scalar(db_url, ended) == 1, 20, "the run to settle")
                # Its answer's read queues behind the other request.
                queued_past_the_timeout("the answer's read to queue")
        waiting.join(30)
        other.join(30)
        assert answer == {"result": "hello"}
        assert shed_requests() <= shed + 1  # the other request's read may be shed; not it


def abandoned_requests() -> float:
    return REGISTRY.get_sample_value("outbox_serve_abandoned_requests_total") or 0.0


def test_a_create_whose_client_left_while_it_queued_is_dropped_having_stored_nothing(
    db_url, model, api_keys
):
    """A client whose timeout is shorter than the queue's gives up and closes its
    connection: its create, run when its turn came, would make a run nobody waits for,
    and a second one when it is sent again without an Idempotency-Key."""
    key = api_keys[TENANTS[0]]
    with (
        serve(db_url, model_base_url=model.url + "/v1", max_connections=2) as url,
        client(url, key, timeout=60) as sdk,
        client(url, key, timeout=1.0) as hasty,
    ):
        gone = abandoned_requests()

        def create(who: openai.OpenAI, text: str) -> Any:
            return who.responses.create(model="scripted", input=text, background=True)

        with server_logs() as logged:
            with keys_locked(db_url):
                first, first_out = in_thread(lambda: create(sdk, "first"))
                wait_until(lambda: blocked_on_a_lock(db_url), 20, "the first create to wait")
                with pytest.raises(openai.APITimeoutError):
                    create(hasty, "second")  # queued behind the first, then left
                wait_until(
                    lambda: REGISTRY.get_sample_value("outbox_serve_queued_calls_of_gone_clients"),
                    20,
                    "the server to see the second's client leave",
                )
            first.join(30)
            wait_until(lambda: abandoned_requests() == gone + 1, 20, "the second to be dropped")
        assert first_out["result"].status == "queued"
        gone_lines = [json.loads(JsonFormatter().format(r)) for r in logged]
        [line] = [g for g in gone_lines if g["event"] == "api.client_gone"]
        assert line["path"] == "/v1/responses" and line["waited_s"] > 1.0
        assert not [r for r in logged if r.msg == "api.unhandled"]
        assert runs(db_url) == 1  # the first's only
        assert create(sdk, "second").status == "queued"  # sent again, it is served
        assert runs(db_url) == 2
