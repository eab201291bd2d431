"""``outbox threads``: create a thread, show its history as a provider would get it, import
a conversation, erase one's content.

``show`` prints what the replay sends a model, not the stored rows: every call paired with
its result, and a repair (if any) said on stderr. ``import`` repairs a conversation's
pairing as it stores it, so imported history never bricks a later turn.
"""

from __future__ import annotations

import uuid
from typing import Any

import click

from outbox import history, lifecycle, retention, writer
from outbox.commands.common import (
    OutboxGroup,
    actor_option,
    connection,
    echo_json,
    json_option,
    read_json_file,
)
from outbox.schemas import NewMessage


@click.group("threads", cls=OutboxGroup)
def threads_group() -> None:
    """Threads: create, show the history as a provider would get it, import, erase."""


@threads_group.command("create")
@click.option("--tenant", required=True)
@click.option("--title")
@click.option("--system", "system_prompt", help="An opening system message.")
@json_option
def threads_create(
    tenant: str, title: str | None, system_prompt: str | None, as_json: bool
) -> None:
    """Create a thread; prints its id."""
    messages = [NewMessage(role="system", content=system_prompt)] if system_prompt else []
    with connection() as conn:
        thread = writer.create_thread(conn, tenant, title=title, messages=messages)
    if as_json:
        echo_json({"id": thread.id, "tenant_id": thread.tenant_id})
        return
    click.echo(str(thread.id))


@threads_group.command("show")
@click.argument("thread_id", type=click.UUID)
@click.option("--tenant", required=True)
@click.option("--api", type=click.Choice(["chat", "responses"]), default="chat")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (what it always prints).")
def threads_show(thread_id: uuid.UUID, tenant: str, api: str, as_json: bool) -> None:
    """Print the thread as provider messages (JSON), every call paired with its result."""
    with connection() as conn:
        messages, report = history.replay(conn, thread_id, tenant, api=api)
    echo_json(messages)
    if report.changed:
        click.echo(f"repaired on replay: {report.as_detail()}", err=True)


@threads_group.command("import")
@click.argument("file", type=click.File())
@click.option("--tenant", required=True)
@click.option("--title")
@json_option
def threads_import(file: Any, tenant: str, title: str | None, as_json: bool) -> None:
    """Import a conversation (a JSON list of OpenAI chat messages), repairing its pairing."""
    messages = read_json_file(file, "conversation file")
    with connection() as conn:
        thread, report = lifecycle.import_thread(conn, tenant, messages, title=title)
    if as_json:
        echo_json({"id": thread.id, "messages": len(messages), "repair": report.as_detail()})
        return
    click.echo(f"thread {thread.id}: {len(messages)} messages imported")
    if report.changed:
        click.echo(
            f"repaired: dropped {len(report.dropped_orphans)} orphan results, "
            f"closed {len(report.closed_calls)} unanswered calls"
        )


@threads_group.command("erase")
@click.argument("thread_id", type=click.UUID)
@click.option("--tenant", help="The thread's tenant (default: the tenant it belongs to).")
@actor_option
@json_option
def threads_erase(thread_id: uuid.UUID, tenant: str | None, actor: str, as_json: bool) -> None:
    """Erase a thread's content (a privacy request), journaled with the actor.

    Its run in flight is cancelled first; message texts, tool call arguments, results,
    orphaned results, response input items and the title are removed, here and in the
    archive; ids, statuses, counts, timestamps, digests and the journal stay. The thread is
    deleted for the API and takes no new run. A call still running when it is erased
    finishes, and its result is kept without content.
    """
    with connection() as conn:
        detail = retention.erase_thread(conn, thread_id, tenant, actor=actor)
    if as_json:
        echo_json(detail)
        return
    cancelled = len(detail["cancelled_runs"])
    click.echo(
        f"thread {thread_id} erased: {detail['messages']} messages, {detail['tool_calls']} "
        f"tool calls, {detail['tool_results']} results, {detail['orphaned_results']} orphaned "
        f"results, {detail['responses']} responses, {detail['archived_documents']} archived "
        f"documents; {cancelled} run(s) cancelled"
    )
