"""The ``outbox`` command: the entry point that assembles the command groups.

Each group lives in its own module of this package (``db.py`` holds ``outbox db``,
``queue.py`` the queue and the commands that act on queued work, ...), and ``common`` holds
what they share: the connection, ``--json`` and ``--actor``, the output, and the
``error:``/``hint:`` refusals with exit status 2 of ``OutboxGroup``. The console script
(``outbox.commands.main:main``), ``python -m outbox.commands`` (the relay children of
``outbox serve --with-relay``) and the checkout's ``python -m cli`` all run ``main``.
"""

from __future__ import annotations

import click

from outbox.commands import (
    approvals,
    credentials,
    db,
    demo,
    journal,
    keys,
    limits,
    mcp,
    platform,
    policy,
    prices,
    queue,
    relay,
    retention,
    runs,
    serve,
    tenants,
    threads,
    tools,
    webhooks,
)
from outbox.commands.common import OutboxGroup


@click.group(cls=OutboxGroup)
@click.version_option(package_name="agent-outbox")
def main() -> None:
    """agent-outbox: tool-using AI agent runs on Postgres, effectively once.

    The database is OUTBOX_DATABASE_URL, or, when that variable is not set, an embedded
    PostgreSQL kept in $OUTBOX_HOME/pgdata (default ./.outbox) that `outbox db start`
    starts (other commands never start it).

    Exit status: 0 done; 2 the command or its input was refused (nothing changed); 75 the
    database did not answer (run it again later); 78 the settings do not fit the database
    (OUTBOX_DATABASE_URL, OUTBOX_SCHEMA, or a schema that needs `outbox db upgrade`). The
    relay has its own: `outbox relay --help`.
    """


# click lists commands by name, so this order is only the reader's: the database first,
# then the registry, the processes, and what operators and tenants act on.
COMMANDS: tuple[click.Command, ...] = (
    db.db_group,
    tools.tools_group,
    mcp.mcp_group,
    relay.relay_command,
    serve.serve_command,
    keys.keys_group,
    webhooks.webhooks_group,
    queue.queue_group,
    queue.requeue_cmd,
    queue.quarantine_cmd,
    queue.release_cmd,
    queue.reconcile_cmd,
    journal.journal_group,
    journal.prune_cmd,
    runs.runs_group,
    threads.threads_group,
    retention.retention_group,
    tenants.tenants_group,
    prices.prices_group,
    platform.platform_group,
    limits.limits_command,
    credentials.credentials_group,
    policy.policy_group,
    approvals.approvals_group,
    demo.demo,
)
for command in COMMANDS:
    main.add_command(command)


if __name__ == "__main__":
    main()
