"""``outbox.assistants`` and ``outbox.keys``: the library ``outbox serve`` stands on."""

from __future__ import annotations

import threading

import psycopg
import pytest

from outbox import assistants, keys, registry, tenancy
from outbox.errors import InvalidInput, NotFound
from tests.relay_harness import scalar, wait_until

FUNCTION = {"type": "function", "function": {"name": "approve", "parameters": {"type": "object"}}}


def as_api(conn: psycopg.Connection, tenant: str) -> None:
    conn.execute("SET LOCAL ROLE outbox_api")
    tenancy.scope(conn, tenant)


def test_two_requests_declaring_the_same_new_function_both_go_on(db_url):
    first, second = psycopg.connect(db_url), psycopg.connect(db_url)
    as_api(first, "acme")
    as_api(second, "acme")
    assert assistants.declare_tools(first, "acme", [FUNCTION]) == ["approve"]
    outcome: list[object] = []

    def declare() -> None:  # blocks on the first one's unique index entry until it commits
        try:
            outcome.append(assistants.declare_tools(second, "acme", [FUNCTION]))
            second.commit()
        except Exception as err:
            outcome.append(err)

    waiter = threading.Thread(target=declare)
    waiter.start()
    blocked = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    wait_until(
        lambda: scalar(db_url, blocked, [second.info.backend_pid]),
        what="the second registration to wait for the first",
    )
    first.commit()
    waiter.join(timeout=30)
    assert outcome == [["approve"]]
    with psycopg.connect(db_url) as conn:
        (tool,) = registry.versions(conn, "approve", "acme")
    assert (tool["executor"], tool["version"]) == ("client", 1)
    first.close()
    second.close()


def test_declared_functions_register_once_and_registered_tools_stay_the_relays(db_url):
    with psycopg.connect(db_url) as conn:
        registry.register(
            conn, registry.ToolSpec(name="lookup", endpoint="http://127.0.0.1:1/lookup")
        )
        conn.commit()
        as_api(conn, "acme")
        lookup = {"type": "function", "function": {"name": "lookup"}}
        for _ in range(2):
            assert assistants.declare_tools(conn, "acme", [FUNCTION, lookup]) == [
                "approve",
                "lookup",
            ]
        assert len(registry.versions(conn, "approve", "acme")) == 1
        with pytest.raises(NotFound):
            registry.versions(conn, "lookup", "acme")  # no client copy of a relay tool
        with pytest.raises(InvalidInput):
            assistants.declare_tools(conn, "acme", [{"type": "file_search"}])


def test_keys_are_kept_hashed_and_revoked_keys_name_no_tenant(db_url):
    with psycopg.connect(db_url) as conn:
        row, key = keys.create_key(conn, "acme", name="ci", actor="test")
        assert keys.tenant_of(conn, key) == "acme"
        stored = conn.execute("SELECT key_hash FROM outbox.api_keys").fetchone()
        assert stored is not None and key not in stored[0] and stored[0] == keys.digest(key)
        keys.revoke_key(conn, row["id"], actor="test")
        assert keys.tenant_of(conn, key) is None
        assert keys.tenant_of(conn, "ob-unknown") is None
        with pytest.raises(InvalidInput):
            keys.create_key(conn, "*")
