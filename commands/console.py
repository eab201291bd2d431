"""``outbox console``: the people who sign in to the web console of ``outbox serve``.

A password is read from a prompt (asked twice) or, with ``--password-stdin``, from the first
line of standard input (for scripts); it is never an argument, so it stays out of shell
histories and process listings. Only its argon2 hash is stored (outbox.accounts). A person
given ``--oidc-subject`` signs in through the OpenID Connect provider of ``outbox serve
--oidc-issuer`` and is asked for no password (unless ``--password-stdin`` gives one too).
"""

from __future__ import annotations

import sys

import click

from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    emit,
    json_option,
)


@click.group("console", cls=OutboxGroup)
def console_group() -> None:
    """The web console of `outbox serve`: its users."""


@console_group.group("users", cls=OutboxGroup)
def users_group() -> None:
    """People who sign in to the console: add, list, remove."""


USER_COLUMNS = [
    "name",
    "tenant_id",
    "role",
    "oidc_subject",
    "failed_attempts",
    "locked_until",
    "created_at",
]


@users_group.command("add")
@click.argument("name")
@click.option("--tenant", required=True, help="Their tenant; '*' with --role operator: every one.")
@click.option(
    "--role",
    type=click.Choice(["reviewer", "operator", "viewer"]),
    required=True,
    help="reviewer: decides approvals; operator: acts on runs; viewer: changes nothing.",
)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option(
    "--oidc-subject",
    metavar="SUB",
    help="They sign in through the OpenID Connect provider of `outbox serve --oidc-issuer`: "
    "the sub claim of their ID tokens (the console's refusal page shows it). No password "
    "is asked for then.",
)
@actor_option
@json_option
def users_add(
    name: str,
    tenant: str,
    role: str,
    password_stdin: bool,
    oidc_subject: str | None,
    actor: str,
    as_json: bool,
) -> None:
    """Add NAME, who signs in to the console with a password (asked for), or through the
    OpenID Connect provider with --oidc-subject."""
    from outbox import accounts

    password: str | None = None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif oidc_subject is None:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    with connection() as conn:
        row = accounts.add_user(
            conn,
            name,
            tenant_id=tenant,
            role=role,
            password=password,
            oidc_subject=oidc_subject,
            actor=actor,
        )
    if as_json:
        echo_json(row)
        return
    how = f", signs in as {row['oidc_subject']} at the provider" if row["oidc_subject"] else ""
    click.echo(f"console user {row['name']}: {row['role']} of tenant {row['tenant_id']}{how}")


@users_group.command("list")
@click.option("--tenant", help="Only this tenant's users.")
@json_option
def users_list(tenant: str | None, as_json: bool) -> None:
    """List console users (never their password hashes)."""
    from outbox import accounts

    with connection() as conn:
        emit(accounts.list_users(conn, tenant), as_json, USER_COLUMNS)


@users_group.command("remove")
@click.argument("name")
@actor_option
@json_option
def users_remove(name: str, actor: str, as_json: bool) -> None:
    """Remove NAME and end their sessions."""
    from outbox import accounts

    with connection() as conn:
        row = accounts.remove_user(conn, name, actor=actor)
    if as_json:
        echo_json(row)
        return
    click.echo(f"removed console user {row['name']} of tenant {row['tenant_id']}")


@users_group.command("unlock")
@click.argument("name")
@actor_option
@json_option
def users_unlock(name: str, actor: str, as_json: bool) -> None:
    """Let NAME sign in again at once after repeated failed sign-ins locked the account."""
    from outbox import accounts

    with connection() as conn:
        row = accounts.unlock_user(conn, name, actor=actor)
    if as_json:
        echo_json(row)
        return
    was = row["was_locked_until"]
    state = f"was locked until {was.isoformat()}" if was is not None else "was not locked"
    click.echo(f"unlocked console user {row['name']} of tenant {row['tenant_id']} ({state})")
