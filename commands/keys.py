"""``outbox keys``: the API keys of ``outbox serve``, each acting for one tenant.

A key is printed once, when it is created: the database keeps only its hash and its first
characters, so a listing can tell keys apart without showing them.
"""

from __future__ import annotations

import uuid

import click

from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("keys", cls=OutboxGroup)
def keys_group() -> None:
    """API keys of `outbox serve`: each acts for one tenant."""


KEY_COLUMNS = ["id", "tenant_id", "name", "key_prefix", "created_at", "revoked_at"]


@keys_group.command("create")
@click.option("--tenant", required=True, help="The tenant the key acts for.")
@click.option("--name", help="A label, to tell keys apart.")
@actor_option
@json_option
def keys_create(tenant: str, name: str | None, actor: str, as_json: bool) -> None:
    """Create an API key for TENANT and print it: it is shown this once (only a hash is
    kept)."""
    from outbox import keys

    with connection() as conn:
        row, key = keys.create_key(conn, tenant, name=name, actor=actor)
    if as_json:
        echo_json({**row, "key": key})
        return
    click.echo(key)
    click.echo(
        f"key {row['id']} for tenant {tenant}: store it now, it is not shown again", err=True
    )


@keys_group.command("list")
@click.option("--tenant", help="Only this tenant's keys.")
@json_option
def keys_list(tenant: str | None, as_json: bool) -> None:
    """List API keys (never the keys themselves: their first characters)."""
    from outbox import keys

    with connection() as conn:
        emit(keys.list_keys(conn, tenant), as_json, KEY_COLUMNS)


@keys_group.command("revoke")
@click.argument("key_id", type=click.UUID)
@actor_option
@json_option
def keys_revoke(key_id: uuid.UUID, actor: str, as_json: bool) -> None:
    """Revoke the API key KEY_ID: every later request with it gets a 401."""
    from outbox import keys

    with connection() as conn:
        row = keys.revoke_key(conn, key_id, actor=actor)
    if as_json:
        echo_json(row)
        return
    click.echo(f"revoked key {row['id']} ({row['key_prefix']}…) of tenant {row['tenant_id']}")
