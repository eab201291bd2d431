"""``outbox webhooks``: the endpoints a tenant's run events are POSTed to, signed.

A signing secret is printed once (on add and rotate): the database keeps it encrypted with
``$OUTBOX_CREDENTIALS_KEY``, which the relay that signs the deliveries holds too.
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


@click.group("webhooks", cls=OutboxGroup)
def webhooks_group() -> None:
    """Signed webhooks: a tenant's run events POSTed to its endpoints (docs/webhooks.md)."""


WEBHOOK_COLUMNS = ["id", "tenant_id", "url", "events", "delivered", "pending", "removed_at"]


@webhooks_group.command("add")
@click.option("--tenant", required=True, help="The tenant whose run events are sent.")
@click.option("--url", required=True, help="The receiver's http(s) URL.")
@click.option(
    "--event",
    "events",
    multiple=True,
    help="An event to send (repeatable): run.queued, run.in_progress, run.requires_action, "
    "run.completed, run.failed, run.cancelled, run.expired. None: all of them.",
)
@actor_option
@json_option
def webhooks_add(tenant: str, url: str, events: tuple[str, ...], actor: str, as_json: bool) -> None:
    """Send TENANT's run events to URL, signed, and print the signing secret: it is shown
    this once (kept encrypted with $OUTBOX_CREDENTIALS_KEY, which the relay needs too)."""
    from outbox import webhooks

    with connection() as conn:
        row, secret = webhooks.add_endpoint(conn, tenant, url, list(events), actor=actor)
    if as_json:
        echo_json({**row, "secret": secret})
        return
    click.echo(secret)
    click.echo(
        f"endpoint {row['id']} for tenant {tenant}: store the secret now, it is not shown again",
        err=True,
    )


@webhooks_group.command("list")
@click.option("--tenant", help="Only this tenant's endpoints.")
@json_option
def webhooks_list(tenant: str | None, as_json: bool) -> None:
    """List endpoints with their deliveries so far (never their secrets)."""
    from outbox import webhooks

    with connection() as conn:
        emit(webhooks.list_endpoints(conn, tenant), as_json, WEBHOOK_COLUMNS)


@webhooks_group.command("remove")
@click.argument("endpoint_id", type=click.UUID)
@actor_option
@json_option
def webhooks_remove(endpoint_id: uuid.UUID, actor: str, as_json: bool) -> None:
    """Stop sending to ENDPOINT_ID; its queued deliveries are dropped, journaled."""
    from outbox import webhooks

    with connection() as conn:
        row = webhooks.remove_endpoint(conn, endpoint_id, actor=actor)
    if as_json:
        echo_json(row)
        return
    click.echo(f"removed endpoint {row['id']} ({row['url']}) of tenant {row['tenant_id']}")


@webhooks_group.command("rotate")
@click.argument("endpoint_id", type=click.UUID)
@actor_option
@json_option
def webhooks_rotate(endpoint_id: uuid.UUID, actor: str, as_json: bool) -> None:
    """Give ENDPOINT_ID a new signing secret and print it (shown this once); every
    delivery from now on, retries included, is signed with it."""
    from outbox import webhooks

    with connection() as conn:
        row, secret = webhooks.rotate_secret(conn, endpoint_id, actor=actor)
    if as_json:
        echo_json({**row, "secret": secret})
        return
    click.echo(secret)
