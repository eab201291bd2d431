"""``outbox credentials``: the secrets tool calls carry, per tenant.

The database keeps where a secret is (an environment variable or a file the relay reads),
or the secret encrypted with a key only the relays and the operator hold; a secret given
here is read from stdin, never from the command line, which other users of the machine can
see.
"""

from __future__ import annotations

import sys

import click

from outbox import credentials
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
    refuse,
)


@click.group("credentials", cls=OutboxGroup)
def credentials_group() -> None:
    """The secrets tool calls carry, per tenant: by reference, or encrypted."""


@credentials_group.command("set")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True, help="'*': every tenant's default.")
@click.option("--env", help="The relay reads the secret from this environment variable.")
@click.option("--file", "file_", help="The relay reads a line NAME=value of this file.")
@click.option(
    "--value-stdin",
    is_flag=True,
    help="Read the secret from stdin and store it encrypted with $OUTBOX_CREDENTIALS_KEY.",
)
@click.option("--header", default="Authorization", show_default=True)
@click.option("--scheme", default="Bearer", show_default=True, help="'' sends the bare value.")
@actor_option
@json_option
def credentials_set(
    name: str,
    tenant: str,
    env: str | None,
    file_: str | None,
    value_stdin: bool,
    header: str,
    scheme: str,
    actor: str,
    as_json: bool,
) -> None:
    """Create or rotate credential NAME (the --credential-ref of a tool) for TENANT.

    \b
    The database keeps where the secret is, never the secret: an environment variable or
    a file the relay reads at call time, or (--value-stdin) the value encrypted with a key
    only the relay and you hold ($OUTBOX_CREDENTIALS_KEY; `outbox credentials new-key`).
    Setting it again rotates it: calls claimed from then on carry the new secret. The
    relay sends it in HEADER ("SCHEME value") to that tool only, and cuts it from
    whatever the tool answers.
    """
    value = sys.stdin.read().strip() if value_stdin else None
    if value_stdin and not value:
        refuse(
            "--value-stdin read nothing", hint="pipe the secret in: ... | outbox credentials set"
        )
    with connection() as conn:
        row = credentials.set_credential(
            conn, name, tenant_id=tenant, env=env, file=file_, value=value, header=header,
            scheme=scheme, actor=actor,
        )  # fmt: skip
    if as_json:
        echo_json(row)
        return
    verb = "set" if row["version"] == 1 else f"rotated to version {row['version']}"
    click.echo(f"credential {name} of tenant {tenant}: {verb} ({row['source']})")


@credentials_group.command("revoke")
@click.argument("name")
@click.option("--tenant", default="*", show_default=True)
@actor_option
@json_option
def credentials_revoke(name: str, tenant: str, actor: str, as_json: bool) -> None:
    """Revoke credential NAME of TENANT: calls that need it end with an error result the
    model sees, never with the old secret. `credentials set` rotates it back in."""
    with connection() as conn:
        row = credentials.revoke(conn, name, tenant_id=tenant, actor=actor)
    if as_json:
        echo_json(row)
        return
    click.echo(f"revoked credential {name} of tenant {tenant}")


@credentials_group.command("list")
@json_option
def credentials_list(as_json: bool) -> None:
    """Every credential: where its secret is, its version, whether it is revoked."""
    with connection() as conn:
        rows = credentials.list_credentials(conn)
    emit(rows, as_json, ["name", "tenant_id", "source", "reference", "version", "revoked_at"])


@credentials_group.command("new-key")
@json_option
def credentials_new_key(as_json: bool) -> None:
    """Print a new key for $OUTBOX_CREDENTIALS_KEY (give it to the relays, keep it safe)."""
    key = credentials.new_key()
    if as_json:
        echo_json({"key": key})
        return
    click.echo(key)
