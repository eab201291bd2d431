"""The ``outbox`` command: the entry point that assembles the command groups.

Each group lives in its own module of this package (``db.py`` holds ``outbox db``,
``queue.py`` the queue and the commands that act on queued work, ...), and ``common`` holds
what they share: the connection, ``--json`` and ``--actor``, the output, and the
``error:``/``hint:`` refusals with exit status 2 of ``OutboxGroup``. The console script
(``outbox.commands.main:main``), ``python -m outbox.commands`` (the relay children of
``outbox serve --with-relay``) and the checkout's ``python -m cli`` all run ``main``.

A group's module is imported when that group runs (or shows its help), not for every
``outbox`` process: importing all of them cost each process, a relay's included, about
0.2 s of CPU. ``outbox --help`` lists every command from ``COMMANDS`` below, which keeps
each one's first sentence of help (a test compares it with the command's own).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import click

from outbox.commands.common import OutboxGroup


@dataclass(frozen=True)
class Lazy:
    """Where a command is (``outbox.commands.<module>.<attribute>``) and its first sentence
    of help, which ``outbox --help`` lists without importing it."""

    module: str
    attribute: str
    short_help: str


class LazyGroup(OutboxGroup):
    """An ``OutboxGroup`` whose commands are imported when one is looked up by name (click's
    lazy group: ``get_command``); listing them (``--help``) reads ``lazy`` instead."""

    def __init__(self, *args: Any, lazy: dict[str, Lazy], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            self.add_command(self.load(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def load(self, name: str) -> click.Command:
        entry = self.lazy[name]
        module = importlib.import_module(f"outbox.commands.{entry.module}")
        command = getattr(module, entry.attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"outbox.commands.{entry.module}.{entry.attribute} is no command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with a command not imported yet shown by its ``Lazy`` help."""
        listed = [(name, self.listed(name)) for name in self.list_commands(ctx)]
        listed = [(name, command) for name, command in listed if not command.hidden]
        if not listed:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in listed)
        with formatter.section("Commands"):
            formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in listed])

    def listed(self, name: str) -> click.Command:
        """The command as ``--help`` lists it: itself once imported, else a stand-in with
        its first sentence of help (click shortens both alike)."""
        if name in self.commands:
            return self.commands[name]
        return click.Command(name, help=self.lazy[name].short_help)


# The commands by name (click lists them sorted): module, attribute, first sentence of help.
COMMANDS: dict[str, Lazy] = {
    "db": Lazy("db", "db_group", "Provision and migrate the database."),
    "tools": Lazy(
        "tools",
        "tools_group",
        "The tool registry: register versions, list, show, enable, disable.",
    ),
    "mcp": Lazy("mcp", "mcp_group", "MCP tool servers: add, sync, set, list, show, remove."),
    "relay": Lazy(
        "relay",
        "relay_command",
        "Run relay workers: claim outbox rows, call tools and models, record the outcomes.",
    ),
    "serve": Lazy(
        "serve",
        "serve_command",
        "Serve OpenAI's Assistants protocol and the run event stream over HTTP.",
    ),
    "keys": Lazy("keys", "keys_group", "API keys of `outbox serve`: each acts for one tenant."),
    "console": Lazy("console", "console_group", "The web console of `outbox serve`: its users."),
    "webhooks": Lazy(
        "webhooks",
        "webhooks_group",
        "Signed webhooks: a tenant's run events POSTed to its endpoints (docs/webhooks.md).",
    ),
    "queue": Lazy("queue", "queue_group", "Inspect the work queue."),
    "requeue": Lazy(
        "queue", "requeue_cmd", "Put quarantined or delayed work back in the queue, due now."
    ),
    "quarantine": Lazy(
        "queue",
        "quarantine_cmd",
        "Hold queued work (a tool call or outbox:N) so no worker claims it.",
    ),
    "release": Lazy(
        "queue",
        "release_cmd",
        "Take quarantined work (a tool call or outbox:N) out of quarantine.",
    ),
    "reconcile": Lazy(
        "queue",
        "reconcile_cmd",
        "Settle an outcome_unknown TOOL_CALL: record its result, or run it again.",
    ),
    "journal": Lazy("journal", "journal_group", "Read the append-only journal."),
    "traces": Lazy(
        "traces", "traces_group", "Traces: export ended runs' spans, built from the database."
    ),
    "prune": Lazy(
        "journal",
        "prune_cmd",
        "Delete journal events older than an age (the schema owner only; journaled).",
    ),
    "runs": Lazy(
        "runs", "runs_group", "Runs: list, show (and the commands that create and steer them)."
    ),
    "threads": Lazy(
        "threads",
        "threads_group",
        "Threads: create, show the history as a provider would get it, import, erase.",
    ),
    "retention": Lazy(
        "retention",
        "retention_group",
        "Retention: idle conversations leave the hot tables (archived or deleted) by policy.",
    ),
    "tenants": Lazy("tenants", "tenants_group", "Per-tenant settings."),
    "prices": Lazy(
        "prices", "prices_group", "Model prices per million tokens: what budgets in money count."
    ),
    "models": Lazy(
        "models",
        "models_group",
        "Models: the catalogue (windows, output limits, prices), prompt budgets, fallbacks, "
        "circuits per base URL and routing rules.",
    ),
    "platform": Lazy("platform", "platform_group", "Limits over every run of every tenant."),
    "limits": Lazy(
        "limits",
        "limits_command",
        "Every tool and tenant with limits, and what each has in flight now.",
    ),
    "credentials": Lazy(
        "credentials",
        "credentials_group",
        "The secrets tool calls carry, per tenant: by reference, or encrypted.",
    ),
    "policy": Lazy(
        "policy",
        "policy_group",
        "Risk policies: per tenant and risk tier, whether a tool call runs, waits, or not.",
    ),
    "approvals": Lazy(
        "approvals",
        "approvals_group",
        "Tool calls waiting for a reviewer: list, show, approve, deny.",
    ),
    "demo": Lazy(
        "demo",
        "demo",
        "Replay the duplicate-ticket incident under faults: the outbox beside a naive loop.",
    ),
}


@click.group(cls=LazyGroup, lazy=COMMANDS)
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


if __name__ == "__main__":
    main()
