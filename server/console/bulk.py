"""The console's bulk actions, one engine for all of them: count, confirm, then act in chunks.

A bulk action (cancel runs, requeue, release or reconcile parked calls, pause or resume
tenants, switch tools off or on) is a ``Bulk``: how many items it would take, how to read
the next chunk of them, and what to do to one. The first post of its form answers the
count; only a post that confirms the count the server counts again then runs (a count that
changed meanwhile is asked again). It runs in chunks of ``CHUNK`` items, one transaction
each, so a large action holds no long transaction and locks no more than a chunk's rows.
Each chunk is read as the person may see it (their tenant's row-level security, every
tenant for ``*``, ``auth.reading``) and keyed past the last item read, so each item is
taken once; the action on each item is the library's own (``ops.requeue``,
``lifecycle.cancel_run``, ``policy.pause_tenant``...), with the person as the actor, in a
savepoint of its own, as the pool's own login, as the command line runs it. An item that
changed meanwhile (the library refuses it, or it changes nothing) is counted as skipped,
never retried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from outbox.accounts import Person
from outbox.errors import OutboxError
from outbox.server.console import auth
from outbox.server.db_pool import Row, Store

CHUNK = 200  # items a bulk action changes in one transaction

# (connection, cursor) -> (the chunk's items to act on, the cursor after it; None: no more)
Chunk = Callable[[Any, Any], tuple[list[Row], Any]]


@dataclasses.dataclass(frozen=True)
class Wording:
    """What a bulk action's confirmation says: "This {verb} <N> {noun} (the ones selected,
    or every one the filter matches): {effect}", its button (``button`` with ``{n}`` the
    count), and once done ``did`` (with ``{n}`` how many were)."""

    title: str
    verb: str
    noun: str
    effect: str
    button: str
    did: str
    back: str  # the page the action was asked from


@dataclasses.dataclass(frozen=True)
class Bulk:
    """One bulk action: ``count`` and ``chunk`` read as the person may see (the items of
    another tenant are neither counted nor taken); ``act`` changes one item as the pool's
    own login and returns what it changed (falsy, or ``OutboxError``: skipped).
    ``own_reads``: the items were checked to be the person's already and are read as the
    pool's own login, as the page shows them (pauses and switches, which no tenant role
    reads)."""

    count: Callable[[Any], int]
    chunk: Chunk
    act: Callable[[Any, Row], object]
    start: Any = 0  # the first chunk's cursor
    own_reads: bool = False


def count(store: Store, person: Person, bulk: Bulk) -> int:
    with _reading(store, person, bulk) as conn:
        return bulk.count(conn)


def run(store: Store, person: Person, bulk: Bulk) -> tuple[int, int]:
    """Act on every item, chunk by chunk: (done, skipped)."""
    done = skipped = 0
    cursor = bulk.start
    while cursor is not None:
        with _reading(store, person, bulk) as conn:
            items, cursor = bulk.chunk(conn, cursor)
        with store.pool.connection() as conn:
            for item in items:
                try:
                    with conn.transaction():  # a refusal leaves nothing half done
                        changed = bulk.act(conn, item)
                except OutboxError:
                    changed = None  # it changed meanwhile: no longer in that state
                if changed:
                    done += 1
                else:
                    skipped += 1
    return done, skipped


def _reading(store: Store, person: Person, bulk: Bulk) -> Any:
    return store.pool.connection() if bulk.own_reads else auth.reading(store, person)


def positions(items: list[Any], read: Callable[[Any, list[Any]], list[Row]]) -> Chunk:
    """The chunks of a selection (``items``, in their order): ``read(conn, chunk)`` gives
    the rows of a chunk that are still to act on; the cursor is a position in the list."""

    def chunk(conn: Any, position: int) -> tuple[list[Row], Any]:
        part = items[position : position + CHUNK]
        following = position + CHUNK
        return read(conn, part), following if following < len(items) else None

    return chunk


def selected(values: dict[str, list[str]], name: str, kind: Callable[[str], Any]) -> list[Any]:
    """A selection's items (the ``name`` checkboxes), each once, sorted; ``ValueError``
    when one is not of ``kind``."""
    return sorted({kind(value) for value in values.get(name, [])})


def repost(values: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The fields the confirmation posts again: everything the first post sent but its
    token and its confirmation (the page adds the current ones)."""
    return [
        (name, value)
        for name, given in values.items()
        if name not in ("csrf_token", "confirm")
        for value in given
    ]
