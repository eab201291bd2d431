"""Requests waiting on their responses read them together (server.reads): those asked at
once are read by one statement per tenant, each request gets its own response, and a
tenant's statement never shows another tenant's response."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outbox import keys
from outbox.errors import NotFound
from outbox.server import responses
from outbox.server.actions import Settings
from outbox.server.bodies import ResponseIn
from outbox.server.db_pool import Store
from outbox.server.reads import SettledReads


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    made = Store(db_url, max_connections=2)
    made.open()
    yield made
    made.close()


def made(store: Store, db_url: str, tenant: str, n: int) -> list[uuid.UUID]:
    """``n`` responses of ``tenant``, created as ``outbox serve`` creates them."""
    with psycopg.connect(db_url) as conn:
        _, key = keys.create_key(conn, tenant, name="reads")
        conn.commit()
    return [
        responses.create(store, key, ResponseIn(model="m", input=f"hello {i}"), Settings())[0]
        for i in range(n)
    ]


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[uuid.UUID]]]:
    """Each statement the reads sent: (tenant, the responses it asked for)."""
    sent: list[tuple[str, list[uuid.UUID]]] = []
    read = responses.get_settled

    def counted(store: Store, tenant: str, idents: list[uuid.UUID]) -> Any:
        sent.append((tenant, list(idents)))
        return read(store, tenant, idents)

    monkeypatch.setattr(responses, "get_settled", counted)
    return sent


def test_reads_asked_at_once_go_in_one_statement_each_with_its_response(store, db_url, statements):
    idents = made(store, db_url, "acme", 5)

    async def ask() -> list[dict[str, Any]]:
        reads = SettledReads(store)
        return await asyncio.gather(*(reads.get("acme", i) for i in idents + idents[:1]))

    shown = asyncio.run(ask())
    assert statements == [("acme", idents)]  # the same response asked twice: read once
    assert [s["id"] for s in shown] == [responses.response_id(i) for i in idents + idents[:1]]
    for ident, one in zip(idents, shown, strict=False):
        assert one == responses.get(store, "acme", ident)  # as a read of its own shows it


def test_a_tenants_statement_never_shows_another_tenants_response(store, db_url, statements):
    acme, globex = made(store, db_url, "acme", 1)[0], made(store, db_url, "globex", 1)[0]

    async def ask() -> list[Any]:
        reads = SettledReads(store)
        return await asyncio.gather(
            reads.get("acme", acme),
            reads.get("acme", globex),  # globex's response, asked by acme
            reads.get("globex", globex),
            return_exceptions=True,
        )

    mine, theirs, own = asyncio.run(ask())
    assert mine["id"] == responses.response_id(acme)
    assert isinstance(theirs, NotFound)
    assert own["id"] == responses.response_id(globex)
    assert sorted(statements) == [("acme", [acme, globex]), ("globex", [globex])]


def test_a_failed_read_fails_each_request_of_it_and_the_next_reads_again(
    store, db_url, monkeypatch
):
    idents = made(store, db_url, "acme", 2)
    read = responses.get_settled
    failing = [True]

    def flaky(*args: Any) -> Any:
        if failing.pop():
            raise psycopg.OperationalError("the database went away")
        return read(*args)

    monkeypatch.setattr(responses, "get_settled", flaky)

    async def ask() -> tuple[list[Any], dict[str, Any]]:
        reads = SettledReads(store)
        asked = (reads.get("acme", i) for i in idents)
        first = await asyncio.gather(*asked, return_exceptions=True)
        failing.append(False)
        return first, await reads.get("acme", idents[0])

    first, again = asyncio.run(ask())
    assert all(isinstance(err, psycopg.OperationalError) for err in first)
    assert again["id"] == responses.response_id(idents[0])


def test_a_request_that_stops_waiting_leaves_the_others_their_answers(store, db_url):
    idents = made(store, db_url, "acme", 2)

    async def ask() -> dict[str, Any]:
        reads = SettledReads(store)
        gone = asyncio.create_task(reads.get("acme", idents[0]))
        kept = asyncio.create_task(reads.get("acme", idents[1]))
        await asyncio.sleep(0)  # one turn of the loop: both asked, their read on its way
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await kept

    assert asyncio.run(ask())["id"] == responses.response_id(idents[1])
