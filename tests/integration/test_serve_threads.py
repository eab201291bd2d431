"""The server runs its handlers' database calls on one thread per database connection
(server.threads): more requests than connections wait their turn and are all answered."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from outbox.server import threads
from tests.serve_harness import TENANTS, client, serve


def test_twenty_waiting_requests_on_two_connections_are_answered_by_two_threads(
    db_url, model, api_keys, relay
):
    with serve(db_url, model_base_url=model.url + "/v1", max_connections=2) as url:
        with client(url, api_keys[TENANTS[0]], timeout=60) as sdk:

            def ask(i: int) -> str:
                return sdk.responses.create(model="scripted", input=f"hello {i}").output_text

            with ThreadPoolExecutor(20) as asking:
                answers = list(asking.map(ask, range(20)))
        pool = threads._pool
        assert answers == ["hello"] * 20
        assert pool._max_workers == 2
        assert 1 <= len(pool._threads) <= 2
