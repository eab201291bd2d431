"""The database work effects need before they start, batched on one connection.

Three kinds of rows need the database between their claim and their effect: a model turn
reads its run, the thread's history and its tools; a call of a tool that cannot dedup
(``lookup``/``none``) commits its dispatch mark; a ``read_result`` call reads the stored
result it pages (``outbox.context``). Thousands of such rows may be in flight
(``relay.engine``), and a connection each is what PostgreSQL cannot give. So the engine's
tasks hand their requests to this one thread, which takes everything waiting and serves
it with one statement per kind (``prepare_turns``, ``mark_dispatched_many`` in
``relay/queries/relay.sql``), then resolves each task's future on the event loop.

A batch of turns also reads, in one statement more, what routes them: every model's
fallback and the circuits that are not clean (``outbox.routing``); each turn's target is
chosen there (a probe taken in the same transaction), and its history written in the
target's API.

When the database goes away mid-batch, the batch waits and is served again once the link
is back: a lost connection is not the row's failure and costs it nothing. If the outage
outlasts a lease, the row's late outcome is fenced and another worker has taken it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox import constants, context, history, registry, routing, statements
from outbox.logs import log
from outbox.relay.links import Link
from outbox.relay.outcomes import Claimed
from outbox.sql import Queries

logger = logging.getLogger("relay.preparer")
BATCH_MAX = 512  # most requests served by one round of statements


@dataclass(slots=True)
class Turn:
    """What a model call needs: the run (its ``model``, ``base_url`` and ``api`` those of the
    chosen target), its history in that API's format, its tools (registry rows by name;
    ``outbox.providers.tool_list`` makes the API's list of them), and the choice of target
    (``outbox.routing``: no target when every server of the turn's chain is behind an open
    circuit)."""

    run: dict[str, Any]
    messages: list[dict[str, Any]]
    tools: dict[str, dict[str, Any]]
    choice: routing.Choice | None = None
    window: context.Window | None = None  # what compacting it needs (outbox.context)

    def take_request(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """The messages and the tools, no longer held here (nor the window's copy of the
        chat): for a turn sent once, whose request need not outlive its sending."""
        messages, tools = self.messages, self.tools
        self.messages, self.tools, self.window = [], {}, None
        return messages, tools


@dataclass
class _Request:
    kind: str  # "mark", "turn" or "read"
    row: Claimed
    future: asyncio.Future[Any]
    message_id: int | None = None  # of "read": the stored result to read


class Preparer:
    """Serves ``mark``, ``turn`` and ``read`` for the engine's tasks, batched, on one link."""

    def __init__(self, link: Link, q: Queries, worker_id: str, stopped: threading.Event) -> None:
        self.link = link
        self.q = q
        self.worker_id = worker_id
        self.stopped = stopped  # set when the process is done: pending requests are dropped
        self.requests: queue.Queue[_Request] = queue.Queue()
        # Base URLs whose server asked this process to wait (Retry-After), until when
        # (monotonic seconds): the model executor's (``relay.model_turns``), read here so a turn
        # with a fallback goes there instead of waiting.
        self.held_until: dict[str | None, float] = {}
        self.thread = threading.Thread(target=self._loop, name="preparer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        self.link.close()

    async def mark(self, row: Claimed) -> bool:
        """Commit this attempt's dispatch mark if the lease is still ours (else False)."""
        result: bool = await self._ask("mark", row)
        return result

    async def turn(self, row: Claimed) -> Turn | str:
        """What the turn's model call needs, or why there is no call to make."""
        result: Turn | str = await self._ask("turn", row)
        return result

    async def read(self, row: Claimed, message_id: int) -> str | None:
        """The stored tool result of message ``message_id`` if it is in the thread and
        tenant of ``row`` (a ``read_result`` call), else None."""
        result: str | None = await self._ask("read", row, message_id)
        return result

    async def _ask(self, kind: str, row: Claimed, message_id: int | None = None) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.requests.put(_Request(kind, row, future, message_id))
        return await future

    # -- the thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                batch = [self.requests.get(timeout=0.1)]
            except queue.Empty:
                continue
            while len(batch) < BATCH_MAX:
                try:
                    batch.append(self.requests.get_nowait())
                except queue.Empty:
                    break
            batch = [r for r in batch if not r.future.done()]  # cancelled at shutdown
            while batch and not self.stopped.is_set():
                try:
                    answers = self._serve(batch)
                    self.link.ok()
                except Exception as err:
                    if self.link.outage(err):
                        # The database went away: the batch waits for it, uncharged.
                        self.stopped.wait(self.link.failed(err))
                        continue
                    # A bug or data the server refused (not an outage: the connection is
                    # fine): fail these tasks, not the thread.
                    log(logger, logging.ERROR, "preparer.failed", error=repr(err), n=len(batch))
                    _resolve(batch, [err] * len(batch))
                    break
                _resolve(batch, answers)
                break

    def _serve(self, batch: list[_Request]) -> list[Any]:
        conn = self.link.get()
        marks = [r for r in batch if r.kind == "mark"]
        turns = [r for r in batch if r.kind == "turn"]
        answers: dict[int, Any] = {}
        with conn.transaction():
            if marks and not any(_must_survive_a_crash(r.row) for r in marks):
                # Marks of key-mode calls only bound *when* the call may be sent again (with
                # the same key), not *whether*: a database crash that lost them lets the next
                # attempt resend sooner, which is all. Not waiting for the WAL flush keeps
                # the commit off the request's path.
                conn.execute("SET LOCAL synchronous_commit TO off")
            if marks:
                ordered = sorted(marks, key=lambda r: r.row.tool_call_ref or 0)
                marked = {
                    ref
                    for (ref,) in conn.execute(
                        self.q.mark_dispatched_many,
                        {
                            "ids": [r.row.id for r in ordered],
                            "refs": [r.row.tool_call_ref for r in ordered],
                            "attempts": [r.row.attempt for r in ordered],
                            "worker": self.worker_id,
                        },
                    ).fetchall()
                }
                for r in marks:
                    answers[id(r)] = r.row.tool_call_ref in marked
            if turns:
                answers.update(self._turns(conn, turns))
            reads = [r for r in batch if r.kind == "read"]
            if reads:
                found = dict(
                    conn.execute(
                        self.q.read_results,
                        {
                            "ids": [r.message_id for r in reads],
                            "tenants": [r.row.tenant_id for r in reads],
                            "threads": [r.row.thread_id for r in reads],
                        },
                    ).fetchall()
                )
                for i, r in enumerate(reads, start=1):
                    answers[id(r)] = found.get(i)
        return [answers[id(r)] for r in batch]

    def _turns(self, conn: psycopg.Connection[Any], turns: list[_Request]) -> dict[int, Any]:
        steps = [step_of(r.row) for r in turns]
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                self.q.prepare_turns,
                {"run_ids": [r.row.run_id for r in turns], "steps": steps},
            )
            found = {(row["run_id"], row["step_no"]): row for row in cur.fetchall()}
            cur.execute(self.q.model_routing_state)
            state = cur.fetchone()
        fallbacks = state["fallbacks"] if state else {}
        circuits = routing.circuits_of(state["circuits"] if state else [])
        cache_keys = state["cache_keys"] if state else {}
        now = time.monotonic()
        held = {
            url: until - now for url, until in list(self.held_until.items()) if url and until > now
        }
        answers: dict[int, Any] = {}
        for request, step_no in zip(turns, steps, strict=True):
            row = found.get((_uuid(request.row.run_id), step_no))

            def take_probe(base_url: str, claimed: Claimed = request.row) -> bool:
                return self._take_probe(conn, claimed, base_url)

            answers[id(request)] = _turn(
                row,
                step_no,
                request.row.failures,
                fallbacks,
                circuits,
                take_probe,
                held,
                cache_keys,
            )
        return answers

    def _take_probe(self, conn: psycopg.Connection[Any], row: Claimed, base_url: str) -> bool:
        """Take the probe of ``base_url``'s open circuit for ``row``'s turn (journaled
        ``model.circuit_probe`` with its run), if no one else took it."""
        (taken,) = conn.execute(self.q.claim_model_probe, {"base_url": base_url}).fetchone() or (
            False,
        )
        if taken:
            statements.journal(
                conn,
                "model.circuit_probe",
                row.tenant_id,
                thread_id=row.thread_id,
                run_id=row.run_id,
                outbox_id=row.id,
                attempt=row.attempt,
                worker=self.worker_id,
                detail={"base_url": base_url, "step_no": step_of(row)},
            )
        return bool(taken)


def _must_survive_a_crash(row: Claimed) -> bool:
    """A mark that decides whether the call may run again (``lookup``/``none``): lost, a
    later attempt would take an ambiguous attempt for a clean one."""
    return registry.idempotency(row.idempotency_mode).dispatch_mark


def step_of(row: Claimed) -> int:
    return int((row.payload or {}).get("step_no", 1))


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _turn(
    row: dict[str, Any] | None,
    step_no: int,
    failures: int,
    fallbacks: dict[str, Any],
    circuits: dict[str, routing.Circuit],
    take_probe: Callable[[str], bool],
    held: dict[str, float],
    cache_keys: dict[str, str],
) -> Turn | str:
    if row is None:
        return "the run does not exist"
    if row["status"] in constants.ENDED:
        return f"run is {row['status']}"
    if row["recorded"]:
        return f"step {step_no} is already recorded"
    options = row["model_options"]
    tools = {tool["name"]: tool for tool in row["tools"]}
    chat = history.from_rows(row["messages"], row["calls"])
    cut = context.cap_results(chat, row["messages"], row["calls"], tools)
    everything = len(chat)
    step = routing.Step(
        step_no,
        after_tools=bool(chat) and chat[-1]["role"] == "tool",
        tokens_left=row["tokens_left"],
    )
    choice = routing.choose(
        row, step, failures, row["route_rules"], fallbacks, circuits, take_probe, held
    )
    target = choice.target
    api = target.api if target is not None else row["api"]
    seqs = [m["seq"] for m in row["messages"]]
    mode, count = context.mode(options)
    if mode == "last_messages":
        chat = context.last_messages(chat, count)
        seqs = seqs[len(seqs) - len(chat) :]
    window = context.Window(
        budget=context.budget(
            options,
            row.get("tenant_prompt_tokens"),
            row.get("platform_prompt_tokens"),
            row.get("context_window"),
            row.get("max_output_tokens"),
        ),
        mode=mode,
        messages=chat,
        seqs=seqs,
        summary=row.get("summary"),
        through_seq=row.get("through_seq") or 0,
        last_input_tokens=row.get("last_input_tokens"),
    )
    if window.summary is not None:
        chat = [context.summary_item(window.summary), *chat]
    # read_result is offered while what the model is sent holds a result cut at its cap
    # or a call of read_result (the model's own history stays answerable).
    sent_cut = any(i >= everything - len(window.messages) for i in cut)
    if context.READ_RESULT not in tools and (sent_cut or _calls_read_result(chat)):
        tools[context.READ_RESULT] = context.READ_RESULT_TOOL
    messages, _ = history.for_provider(chat, api)
    model = target.model if target is not None else row["model"]
    run = {
        "id": row["run_id"],
        "tenant_id": row["tenant_id"],
        "thread_id": row["thread_id"],
        "api": api,
        "model": model,
        # which prompt_cache_key its requests carry (outbox.providers.cache_key)
        "prompt_cache_key": cache_keys.get(model, "derived"),
        "instructions": row["instructions"],
        "base_url": target.base_url if target is not None else row["base_url"],
        "model_options": row["model_options"],
        "calls_made": row["calls_made"],
    }
    return Turn(run, messages, tools, choice, window)


def _calls_read_result(chat: list[dict[str, Any]]) -> bool:
    return any(
        call["function"]["name"] == context.READ_RESULT
        for message in chat
        for call in message.get("tool_calls") or ()
    )


def _resolve(batch: list[_Request], answers: list[Any]) -> None:
    """Hand each task its answer on its event loop (one hop for the whole batch)."""
    if not batch:
        return
    loop = batch[0].future.get_loop()

    def settle() -> None:
        for request, answer in zip(batch, answers, strict=True):
            if request.future.done():
                continue
            if isinstance(answer, BaseException):
                request.future.set_exception(answer)
            else:
                request.future.set_result(answer)

    with contextlib.suppress(RuntimeError):  # a closed loop: the worker is gone
        loop.call_soon_threadsafe(settle)
