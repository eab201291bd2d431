"""The console's pages, forms and live streams, mounted at ``/console`` (``MOUNT``).

Pages: the sign-in, the approvals inbox (``/console/approvals``), the runs list
(``/console/runs``, keyset-paginated, with a bulk cancel), a run's timeline
(``/console/runs/{id}``), the parked calls (``/console/parked``: release, requeue and
reconcile one call, or a selection or everything the list's filters match) and the
operations page (``/console/operations``: kill switches, pauses, budgets and limits, and
tenants and tools switched in bulk). The inbox and the timeline are also served alone as
fragments (``.../list``, ``.../timeline``) that the page's script fetches again when the
page's event stream says something changed (``.../events``); without the script a reload
shows the same truth. Bulk actions share one engine (``server.console.bulk``).

Rules: a GET without a session is sent to the sign-in; a POST without one, or without the
session's CSRF token, is refused (403). A person sees and acts in their own tenant only,
through the server's tenant-scoped transactions (row-level security): another tenant's
approval, run or call is a 404, as in the API. A viewer decides nothing, only operators act
on calls, runs, tools and tenants (403), and a platform's settings (a tool's limits) are a
platform operator's. Decisions go through ``outbox.approvals.decide``, actions through
``outbox.ops``, ``outbox.lifecycle``, ``outbox.policy``, ``outbox.budgets`` and
``outbox.limits`` with the person's name as the actor, journaled as the CLI's are. A
platform operator (tenant ``*``) reads and acts through the pool's own login, which sees
every tenant; so do actions once their item is found in the person's tenant (``outbox_api``
may not change the queue or the settings).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from psycopg.types.json import Jsonb
from sse_starlette.sse import EventSourceResponse
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from outbox import (
    accounts,
    approvals,
    budgets,
    calls,
    constants,
    lifecycle,
    limits,
    ops,
    policy,
    registry,
)
from outbox.accounts import Person
from outbox.errors import InvalidInput, NotFound, OutboxError
from outbox.logs import log
from outbox.server import QUERIES, events
from outbox.server.console import STATIC, TEMPLATES, auth, bulk, oidc, redact, trace_links
from outbox.server.db_pool import Row, Store
from outbox.server.errors import APIError
from outbox.server.routes import Config, config
from outbox.server.thread_pool import in_thread, read_in_thread
from outbox.sql import Queries
from outbox.statements import fetch_all, fetch_one

Q = Queries(QUERIES / "console.sql")
logger = logging.getLogger("server.console")  # JSON lines as every server log (outbox.logs)

INBOX_LIMIT = 200  # waiting approvals a page shows at most
CONTEXT_MESSAGES = 6  # messages of the run's thread an approval shows, up to the call's
CONTEXT_CHARS = 2000  # characters of each of them
RUNS_PAGE = 50  # runs a page of the list shows
EXACT_COUNT = 10_000  # the most runs counted exactly; the planner's estimate above
COUNT_TIMEOUT = "SET LOCAL statement_timeout = '100ms'"  # an exact count's longest time
RUN_STATUSES = (*constants.ACTIVE, *constants.ENDED)
SESSION_CHECK_S = 15.0  # a stream's longest quiet wait before it checks its session again
UNLISTENED_S = 2.0  # how often a page is told to look again while the listener is down
SIGN_IN_S = 600  # how long a sign-in form's token lives

ENV = Environment(
    loader=FileSystemLoader(str(TEMPLATES)),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=str)


def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(ENV.get_template(name).render(**context), status_code=status)


def problem(status: int, message: str, person: Person | None = None) -> HTMLResponse:
    return page("problem.html", status, message=message, person=person)


async def signed_in(request: Request) -> Person | None:
    """The person of the request's session; read-only on a console served read-only
    (``outbox serve --console-read-only``), whatever their role."""
    token = request.cookies.get(auth.COOKIE)
    person = await read_in_thread(auth.person_of, config(request).store, token)
    if person is not None and getattr(request.app.state, "console_read_only", False):
        return dataclasses.replace(person, read_only=True)
    return person


def refused(person: Person, what: str) -> HTMLResponse:
    """403 for a person who may not do ``what``: read-only, or not in that role."""
    if person.read_only:
        return problem(403, "This console is read-only: it changes nothing.", person)
    return problem(403, what, person)


def to_sign_in() -> RedirectResponse:
    return RedirectResponse("/console/sign-in", status_code=303)


# -- sign-in ------------------------------------------------------------------------------


async def sign_in_page(request: Request) -> Response:
    return _sign_in_form(request, 200, "")


def _sign_in_form(request: Request, status: int, message: str, command: str = "") -> Response:
    """The sign-in page: the password form (unless ``--no-password-sign-in``) and the
    provider's button (with ``--oidc-issuer``); ``command``: what an operator must run."""
    token = secrets.token_urlsafe(32)
    provider = _provider(request)
    response = page(
        "sign_in.html",
        status,
        csrf_token=token,
        message=message,
        command=command,
        person=None,
        passwords=_passwords(request),
        provider=provider.settings.label if provider is not None else None,
    )
    auth.set_cookie(request, response, auth.SIGN_IN_COOKIE, token, SIGN_IN_S)
    return response


def _provider(request: Request) -> oidc.Provider | None:
    provider: oidc.Provider | None = getattr(request.app.state, "console_oidc", None)
    return provider


def _passwords(request: Request) -> bool:
    """Whether people sign in with a password here (not ``--no-password-sign-in``)."""
    return bool(getattr(request.app.state, "console_passwords", True))


async def sign_in(request: Request) -> Response:
    fields = await auth.form(request)
    if not auth.csrf_ok(request.cookies.get(auth.SIGN_IN_COOKIE), fields.get("csrf_token")):
        return problem(403, "This form has expired or did not come from this console.")
    if not _passwords(request):
        return problem(
            403, "This console signs people in through its provider only, never with a password."
        )
    name, password = fields.get("name", ""), fields.get("password", "")
    outcome = await in_thread(_sign_in, config(request).store, name, password)
    if outcome.token is None:
        if outcome.locked:
            message = "This account is locked after repeated failed sign-ins; try again later."
            return _sign_in_form(request, 429, message)
        return _sign_in_form(request, 401, "Wrong name or password.")
    response = RedirectResponse("/console/approvals", status_code=303)
    auth.set_cookie(request, response, auth.COOKIE, outcome.token, accounts.SESSION_S)
    auth.clear_cookie(request, response, auth.SIGN_IN_COOKIE)
    return response


def _sign_in(store: Store, name: str, password: str) -> accounts.SignIn:
    with auth.as_api(store) as conn:
        return accounts.sign_in(conn, name, password)


# -- sign-in through an OpenID Connect provider (server.console.oidc) -------------------


async def oidc_start(request: Request) -> Response:
    """Send the browser to the provider, with a new flow (state, nonce, PKCE verifier) in
    this browser's flow cookie."""
    provider = _provider(request)
    if provider is None:
        return problem(404, "This console signs in with no provider (outbox serve --oidc-issuer).")
    flow = oidc.Flow.new()
    try:
        url = await provider.authorization_url(flow, _redirect_uri(request, provider))
    except oidc.Refused as err:
        return _oidc_refused(request, err)
    response = RedirectResponse(url, status_code=303)
    auth.set_cookie(request, response, oidc.FLOW_COOKIE, flow.cookie(), SIGN_IN_S)
    return response


async def oidc_callback(request: Request) -> Response:
    """Where the provider sends the browser back: a session for the console account with
    the verified subject, or the sign-in page saying why not (and no session). The flow
    cookie is spent either way: a callback replayed in this browser finds none."""
    provider = _provider(request)
    if provider is None:
        return problem(404, "This console signs in with no provider (outbox serve --oidc-issuer).")
    flow = oidc.Flow.from_cookie(request.cookies.get(oidc.FLOW_COOKIE))
    if flow is None:
        message = (
            "This sign-in was not started in this browser, or more than 10 minutes ago. "
            "Start it again."
        )
        return _oidc_refused(request, oidc.Refused(message, 400))
    query = dict(request.query_params)
    try:
        subject = await provider.subject(flow, query, _redirect_uri(request, provider))
    except oidc.Refused as err:
        return _oidc_refused(request, err)
    opened = await in_thread(_oidc_sign_in, config(request).store, subject)
    if opened is None:
        log(logger, logging.WARNING, "console.oidc_unknown_subject", subject=subject)
        label = provider.settings.label
        message = (
            f"You signed in at {label} as subject {subject}, but no console user of this "
            "server has that subject, so you have no tenant or role here. Ask an operator "
            "to run:"
        )
        command = (
            "outbox console users add YOUR_NAME --tenant TENANT --role reviewer "
            f"--oidc-subject {shlex.quote(subject)}"
        )
        return _oidc_refused(request, oidc.Refused(message, 403), command)
    who, token = opened
    log(
        logger,
        logging.INFO,
        "console.signed_in",
        tenant_id=who["tenant_id"],
        person=who["name"],
        method="oidc",
    )
    response = RedirectResponse("/console/approvals", status_code=303)
    auth.set_cookie(request, response, auth.COOKIE, token, accounts.SESSION_S)
    auth.clear_cookie(request, response, oidc.FLOW_COOKIE)
    return response


def _redirect_uri(request: Request, provider: oidc.Provider) -> str:
    """Where the provider sends the browser back: ``--oidc-redirect-url``, or this
    console's callback at the URL the browser used."""
    given = provider.settings.redirect_url
    return given or str(request.base_url).rstrip("/") + oidc.CALLBACK


def _oidc_refused(request: Request, err: oidc.Refused, command: str = "") -> Response:
    log(logger, logging.WARNING, "console.oidc_refused", reason=str(err), status=err.status)
    response = _sign_in_form(request, err.status, str(err), command)
    auth.clear_cookie(request, response, oidc.FLOW_COOKIE)
    return response


def _oidc_sign_in(store: Store, subject: str) -> tuple[Row, str] | None:
    with auth.as_api(store) as conn:
        return accounts.oidc_sign_in(conn, subject)


async def sign_out(request: Request) -> Response:
    person = await signed_in(request)
    fields = await auth.form(request)
    if person is None or not auth.csrf_ok(person.csrf_token, fields.get("csrf_token")):
        return problem(403, "This form did not come from your session.")
    await in_thread(_sign_out, config(request).store, request.cookies[auth.COOKIE])
    response = to_sign_in()
    auth.clear_cookie(request, response, auth.COOKIE)
    return response


def _sign_out(store: Store, token: str) -> None:
    with auth.as_api(store) as conn:
        accounts.sign_out(conn, token)


# -- the approvals inbox ------------------------------------------------------------------


def waiting(store: Store, person: Person) -> list[Row]:
    """The approvals waiting in the person's tenant (every tenant's for ``*``), each with
    its ``context``: the turns that led to the call."""
    if person.every_tenant:
        with store.pool.connection() as conn:
            rows = approvals.list_approvals(conn, "pending", None, INBOX_LIMIT)
            return with_context(conn, rows)
    with store.tenant(person.tenant_id) as conn:
        rows = approvals.list_approvals(conn, "pending", person.tenant_id, INBOX_LIMIT)
        return with_context(conn, rows)


def with_context(conn: Any, rows: list[Row]) -> list[Row]:
    """``rows`` (approvals), each given ``context``: the last ``CONTEXT_MESSAGES`` messages
    of its thread up to the one that asked for the call, each cut to ``CONTEXT_CHARS``
    characters and then of what looks like a secret (``redact.cut_secrets``)."""
    params = {
        "refs": [r["tool_call_ref"] for r in rows],
        "messages": CONTEXT_MESSAGES,
        "chars": CONTEXT_CHARS,
    }
    turns: dict[int, list[Row]] = {}
    for turn in fetch_all(conn, Q.approval_context, params) if rows else []:
        turn["content"] = redact.cut_secrets(turn["content"] or "")
        turns.setdefault(turn["tool_call_ref"], []).append(turn)
    return [{**row, "context": turns.get(row["tool_call_ref"], [])} for row in rows]


async def inbox(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return to_sign_in()
    rows = await read_in_thread(waiting, config(request).store, person)
    return page("approvals.html", person=person, approvals=rows, message="")


async def inbox_list(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return problem(401, "Sign in again.")
    rows = await read_in_thread(waiting, config(request).store, person)
    return page("_approvals.html", person=person, approvals=rows)


async def inbox_events(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return problem(401, "Sign in again.")
    session = Session(config(request).store, request.cookies[auth.COOKIE], person)
    return EventSourceResponse(_inbox_changes(config(request), session, person.tenant_id))


async def _inbox_changes(
    cfg: Config, session: Session, tenant_id: str
) -> AsyncIterator[dict[str, Any]]:
    """``changed`` whenever an approval of the tenant is requested or decided (the server's
    listener on ``outbox_approvals``): the page fetches its list again. ``ready`` first, so
    a page also catches what changed between its load and this stream's start;
    ``signed_out`` and the end once the session has (``Session``)."""
    with cfg.wakeups.watch_tenant(tenant_id) as watch:
        yield {"event": "ready", "data": ""}
        while True:
            watch.clear()
            await watch.changed(UNLISTENED_S, listened_s=SESSION_CHECK_S)
            if await session.current() is None:
                yield SIGNED_OUT
                return
            if watch.flag.is_set() or not cfg.wakeups.listening:
                yield {"event": "changed", "data": ""}


class Session:
    """An open stream's session, checked again once ``SESSION_CHECK_S`` passed since the
    last check: a stream whose session expired or signed out says ``signed_out`` and ends
    (the page's script then loads the page again, which leads to the sign-in). Not at
    every change: each change sends the page to read its list, which checks it anyway."""

    def __init__(self, store: Store, token: str, person: Person) -> None:
        self.store, self.token = store, token
        self.person: Person | None = person
        self.checked = time.monotonic()

    async def current(self) -> Person | None:
        if time.monotonic() - self.checked >= SESSION_CHECK_S:
            self.person = await read_in_thread(auth.person_of, self.store, self.token)
            self.checked = time.monotonic()
        return self.person


SIGNED_OUT = {"event": "signed_out", "data": ""}


async def decide(request: Request) -> Response:
    person = await signed_in(request)
    fields = await auth.form(request)
    if person is None or not auth.csrf_ok(person.csrf_token, fields.get("csrf_token")):
        return problem(403, "This form did not come from your session.")
    if not person.may_decide:
        return refused(person, "A viewer decides nothing.")
    decision = fields.get("decision", "")
    if decision not in ("approve", "deny"):
        return problem(400, "Choose approve or deny.", person)
    approval_id = int(request.path_params["approval_id"])
    store = config(request).store
    try:
        await in_thread(
            _decide,
            store,
            person,
            approval_id,
            decision,
            fields.get("reason", ""),
            fields.get("digest") or None,
        )
    except NotFound:
        return problem(404, f"No waiting approval {approval_id} in your tenant.", person)
    except OutboxError as err:
        rows = await read_in_thread(waiting, store, person)
        message = err.args[0] if err.args else str(err)
        return page("approvals.html", 409, person=person, approvals=rows, message=message)
    return RedirectResponse("/console/approvals", status_code=303)


def _decide(
    store: Store,
    person: Person,
    approval_id: int,
    decision: str,
    reason: str,
    digest: str | None,
) -> Row:
    if person.every_tenant:
        with store.pool.connection() as conn:
            return approvals.decide(
                conn, approval_id, decision, actor=person.name, reason=reason, digest=digest
            )
    with store.tenant(person.tenant_id) as conn:
        approvals.get(conn, approval_id)  # another tenant's is not seen: NotFound
        return approvals.decide(
            conn,
            approval_id,
            decision,
            actor=person.name,
            reason=reason,
            digest=digest,
            tenant_id=person.tenant_id,
        )


# -- the runs list ------------------------------------------------------------------------


def _filters(query: Mapping[str, str]) -> dict[str, Any] | None:
    """The list's filters and keyset cursor from a query string or a form; None when one is
    not valid."""
    params: dict[str, Any] = {
        "status": query.get("status") or None,
        "model": query.get("model") or None,
        "tenant_id": query.get("tenant") or None,
        "tool": query.get("tool") or None,
        "metadata": None,
        "since": None,
        "before_at": None,
        "before_id": None,
    }
    if wanted := query.get("metadata", "").strip():
        pairs = [pair.partition("=") for pair in wanted.split(",")]
        if any(not key.strip() or not sep for key, sep, _ in pairs):
            return None
        params["metadata"] = Jsonb({key.strip(): value.strip() for key, _, value in pairs})
    try:
        if since := query.get("since"):
            params["since"] = datetime.fromisoformat(since)
        if before := query.get("before"):
            at, _, ident = before.partition("|")
            params["before_at"], params["before_id"] = datetime.fromisoformat(at), uuid.UUID(ident)
    except ValueError:
        return None
    if params["status"] is not None and params["status"] not in RUN_STATUSES:
        return None
    return params


def runs_page(
    store: Store, person: Person, params: dict[str, Any]
) -> tuple[list[Row], tuple[int, bool]]:
    """One page of runs (``RUNS_PAGE``) of the person's tenant (any for ``*``), and how many
    runs the filters match (``runs_matched``)."""
    params = _in_scope(person, params)
    with auth.reading(store, person) as conn:
        rows = fetch_all(conn, Q.runs_page, {**params, "limit": RUNS_PAGE})
        return rows, runs_matched(conn, params)


def _in_scope(person: Person, params: dict[str, Any]) -> dict[str, Any]:
    """The list's filters, of the person's tenant only (any tenant for ``*``)."""
    return params if person.every_tenant else {**params, "tenant_id": person.tenant_id}


def _scope(person: Person) -> str | None:
    """The person's tenant; None for a platform operator, who sees every tenant."""
    return None if person.every_tenant else person.tenant_id


def runs_matched(conn: Any, params: dict[str, Any]) -> tuple[int, bool]:
    """How many runs the filters match, and whether exactly: the planner's estimate of
    the whole list (no scan), then an exact count when the estimate is ``EXACT_COUNT`` or
    fewer; a count of more would read that many rows on every page. The planner guesses
    a tool's or metadata's share, so a count it thought small can still read every run:
    it gives up after ``COUNT_TIMEOUT`` and the estimate stands."""
    every = {**params, "before_at": None, "before_id": None, "limit": None}
    (plan,) = conn.execute("EXPLAIN (FORMAT JSON) " + Q.runs_page, every).fetchone()
    estimate = int(plan[0]["Plan"]["Plan Rows"])
    if estimate > EXACT_COUNT:
        return estimate, False
    try:
        with conn.transaction():  # a savepoint: a count cut short leaves the page's read
            conn.execute(COUNT_TIMEOUT)
            row = fetch_one(conn, "SELECT count(*) AS n FROM (" + Q.runs_page + ") m", every)
    except psycopg.errors.QueryCanceled:
        return estimate, False
    return (int(row["n"]) if row else 0), True


async def runs(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return to_sign_in()
    params = _filters(request.query_params)
    if params is None:
        message = (
            "A filter of this list is not valid: a status of the list, a time as "
            "2026-12-01T00:00:00+00:00, metadata as key=value pairs separated by commas."
        )
        return problem(400, message, person)
    rows, (matched, exact) = await read_in_thread(runs_page, config(request).store, person, params)
    older = None
    if len(rows) == RUNS_PAGE:
        last = rows[-1]
        kept = {k: v for k, v in request.query_params.items() if k != "before" and v}
        older = urlencode({**kept, "before": f"{last['created_at'].isoformat()}|{last['id']}"})
    return page(
        "runs.html",
        person=person,
        runs=rows,
        matched=matched,
        exact=exact,
        older=older,
        statuses=RUN_STATUSES,
        chosen=request.query_params,
    )


# -- bulk actions -------------------------------------------------------------------------


async def operator_form(
    request: Request, what: str
) -> tuple[Person, dict[str, list[str]]] | Response:
    """The person and the fields (every value of each) of an operator's form; a refusal
    instead without a session or its CSRF token (403), or for someone who is no operator
    or on a read-only console (403: ``what`` says what they may not do)."""
    person = await signed_in(request)
    values = await auth.form_values(request)
    token = values.get("csrf_token", [""])[0]
    if person is None or not auth.csrf_ok(person.csrf_token, token):
        return problem(403, "This form did not come from your session.")
    if not person.may_operate:
        return refused(person, what)
    return person, values


async def confirm_then_run(
    request: Request,
    person: Person,
    values: dict[str, list[str]],
    action: bulk.Bulk,
    words: bulk.Wording,
) -> Response:
    """A bulk action's two posts (``server.console.bulk``): the first answers the count to
    confirm; one that confirms the count the server counts again now runs it."""
    store = config(request).store
    try:
        count = await read_in_thread(bulk.count, store, person, action)
    except (InvalidInput, NotFound) as err:  # an item of the form that is not valid
        return problem(400, str(err), person)
    context: dict[str, Any] = {
        "person": person,
        "count": count,
        "words": words,
        "by_filter": values.get("scope") == ["filter"],
        "fields": bulk.repost(values),
        "url": request.url.path,
    }
    if values.get("confirm") != [str(count)] or count == 0:
        return page("confirm.html", **context)
    done, skipped = await in_thread(bulk.run, store, person, action)
    message = words.did.format(n=done) + (
        f"; {skipped} skipped: they changed meanwhile." if skipped else "."
    )
    return page("confirm.html", **context, done=message)


# -- bulk cancel of runs ------------------------------------------------------------------


async def bulk_cancel(request: Request) -> Response:
    """Cancel the active runs of a selection (``scope=selection``: the ``run`` checkboxes)
    or of everything the list's filters match (``scope=filter``), each run through
    ``lifecycle.cancel_run`` with the person as actor (journaled as ``outbox runs
    cancel``), confirmed with the count and run in chunks (``confirm_then_run``)."""
    asked = await operator_form(request, "Only an operator cancels runs.")
    if isinstance(asked, Response):
        return asked
    person, values = asked
    if values.get("scope") == ["selection"]:
        try:
            runs = bulk.selected(values, "run", uuid.UUID)
        except ValueError:
            return problem(400, "A selected run is not a run id.", person)
        if not runs:
            return problem(400, "Select the runs to cancel first.", person)
        action = _cancel_selected(person, runs)
    else:
        params = _filters({name: given[0] for name, given in values.items()})
        if params is None:
            return problem(400, "A filter of this list is not valid.", person)
        action = _cancel_matching(person, _in_scope(person, params))
    return await confirm_then_run(request, person, values, action, CANCEL_WORDS)


CANCEL_WORDS = bulk.Wording(
    title="Cancel runs",
    verb="cancels",
    noun="active runs",
    effect="no new work is claimed for them, calls already running finish and their "
    "results are kept aside, each run journaled with your name. It cannot be undone.",
    button="Cancel {n} runs",
    did="Cancelled {n} runs",
    back="/console/runs",
)


def _cancel(person: Person) -> Callable[[Any, Row], object]:
    def act(conn: Any, run: Row) -> object:
        return lifecycle.cancel_run(conn, run["id"], run["tenant_id"], actor=person.name)

    return act


def _cancel_selected(person: Person, runs: list[uuid.UUID]) -> bulk.Bulk:
    """The selected runs that are active, in the order of their ids."""

    def count(conn: Any) -> int:
        row = fetch_one(conn, Q.active_runs_count, {"ids": runs, "active": ACTIVE})
        return int(row["n"]) if row else 0

    def read(conn: Any, part: list[uuid.UUID]) -> list[Row]:
        return fetch_all(conn, Q.active_runs_of, {"ids": part, "active": ACTIVE})

    return bulk.Bulk(count=count, chunk=bulk.positions(runs, read), act=_cancel(person))


def _cancel_matching(person: Person, params: dict[str, Any]) -> bulk.Bulk:
    """The active runs the filters match, newest first by the list's keyset (a cancel
    changes neither key, so each run is taken once)."""

    def count(conn: Any) -> int:
        every = {**params, "before_at": None, "before_id": None, "limit": None}
        query = "SELECT count(*) AS n FROM (" + Q.runs_page + ") m WHERE m.status = ANY(%(active)s)"
        row = fetch_one(conn, query, {**every, "active": ACTIVE})
        return int(row["n"]) if row else 0

    def chunk(conn: Any, cursor: tuple[Any, Any]) -> tuple[list[Row], Any]:
        keyset = {"before_at": cursor[0], "before_id": cursor[1], "limit": bulk.CHUNK}
        rows = fetch_all(conn, Q.runs_page, {**params, **keyset})
        following = (rows[-1]["created_at"], rows[-1]["id"]) if len(rows) == bulk.CHUNK else None
        return [r for r in rows if r["status"] in ACTIVE], following

    return bulk.Bulk(count=count, chunk=chunk, act=_cancel(person), start=(None, None))


ACTIVE = list(constants.ACTIVE)


# -- parked calls -------------------------------------------------------------------------

PARKED = ("quarantined", "outcome_unknown")
PARKED_FILTERS = ("tool", "status", "tenant")


def _parked_filters(person: Person, query: Mapping[str, str]) -> dict[str, Any] | None:
    """The parked calls' filters (tool, status, and tenant for ``*``), of the person's
    tenant only; None when the status is not one a parked call has."""
    status = query.get("status") or None
    if status is not None and status not in PARKED:
        return None
    tenant = (query.get("tenant") or None) if person.every_tenant else person.tenant_id
    return {"tool": query.get("tool") or None, "status": status, "tenant_id": tenant}


def parked_calls(store: Store, person: Person, filters: dict[str, Any]) -> list[Row]:
    """The calls parked for an operator that the filters match, of the person's tenant
    (every tenant's for ``*``)."""
    with auth.reading(store, person) as conn:
        return fetch_all(conn, Q.parked_calls, {**filters, "limit": INBOX_LIMIT})


PARKED_FILTER_PROBLEM = (
    "A filter of this list is not valid: the status is quarantined or outcome_unknown."
)


async def parked(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return to_sign_in()
    filters = _parked_filters(person, request.query_params)
    if filters is None:
        return problem(400, PARKED_FILTER_PROBLEM, person)
    return await _parked_page(request, person, filters)


async def _parked_page(
    request: Request, person: Person, filters: dict[str, Any], status: int = 200, message: str = ""
) -> Response:
    rows = await read_in_thread(parked_calls, config(request).store, person, filters)
    chosen = {k: v for k, v in request.query_params.items() if k in PARKED_FILTERS and v}
    return page("parked.html", status, person=person, calls=rows, message=message, chosen=chosen)


async def act_on_call(request: Request) -> Response:
    asked = await operator_form(request, "Only an operator acts on calls.")
    if isinstance(asked, Response):
        return asked
    person, values = asked
    fields = {name: given[0] for name, given in values.items()}
    action = request.path_params["action"]
    if action == "reconcile":
        action = {"yes": "happened", "no": "not-happened"}.get(fields.get("happened", ""), "")
        if not action:
            return problem(400, SETTLE_PROBLEM, person)
    elif action not in ("requeue", "release"):
        return problem(404, "No such action.", person)
    try:
        result = _answer(action, fields)
    except ValueError:
        return problem(400, SETTLE_PROBLEM, person)
    ref = int(request.path_params["ref"])
    try:
        await in_thread(_act_on_call, config(request).store, person, ref, action, result)
    except NotFound:
        return problem(404, f"No tool call {ref} in your tenant.", person)
    except OutboxError as err:
        filters = _parked_filters(person, {}) or {}
        return await _parked_page(request, person, filters, 409, str(err))
    return RedirectResponse("/console/parked", status_code=303)


SETTLE_PROBLEM = (
    "Say whether the call's side effect happened and, if it did, give what the tool "
    'answered as JSON (for example {"refund_id": "r-7"}).'
)


def _answer(action: str, fields: Mapping[str, str]) -> Any:
    """What the tool answered, for an action that says the side effect happened: the
    form's ``result`` as JSON (``ValueError`` when it is not)."""
    return json.loads(fields.get("result", "")) if action == "happened" else None


def on_call(conn: Any, ref: int, action: str, actor: str, result: Any = None) -> object:
    """``ops.requeue``, ``ops.release`` or ``ops.reconcile`` (``happened``: with
    ``result`` as the call's output; ``not-happened``: it runs again) of the call with the
    person as actor, journaled as ``outbox requeue``, ``release`` and ``reconcile``."""
    ident = f"call:{ref}"
    if action in ("happened", "not-happened"):
        happened = action == "happened"
        return ops.reconcile(conn, ident, happened=happened, result=result, actor=actor)
    if action == "release":
        return ops.release(conn, ident, actor=actor)
    return ops.requeue(conn, ident, actor=actor)


def _act_on_call(store: Store, person: Person, ref: int, action: str, result: Any) -> None:
    """``on_call``, once the call is found the person's tenant's (read under its row-level
    security); the action then runs as the pool's own login, as the command line's
    (``outbox_api`` may not change the queue)."""
    if not person.every_tenant:
        with store.tenant(person.tenant_id) as conn:
            if fetch_one(conn, Q.call_tenant, {"id": ref}) is None:
                raise NotFound(f"tool call {ref} does not exist")
    with store.pool.connection() as conn:
        on_call(conn, ref, action, person.name, result)


async def bulk_calls(request: Request) -> Response:
    """Requeue, release or reconcile the parked calls of a selection (``scope=selection``:
    the ``call`` checkboxes) or of everything the list's filters match (``scope=filter``),
    each through ``on_call`` with the person as actor, confirmed with the count and run in
    chunks (``confirm_then_run``). A requeue or release takes quarantined calls, a
    reconcile those whose outcome is unknown."""
    asked = await operator_form(request, "Only an operator acts on calls.")
    if isinstance(asked, Response):
        return asked
    person, values = asked
    fields = {name: given[0] for name, given in values.items()}
    action = fields.get("action", "")
    if action not in CALL_WORDS:
        return problem(400, "Choose requeue, release, or reconcile as happened or not.", person)
    try:
        result = _answer(action, fields)
    except ValueError:
        return problem(400, SETTLE_PROBLEM, person)
    filters = _parked_filters(person, fields)
    if filters is None:
        return problem(400, PARKED_FILTER_PROBLEM, person)
    ids: list[int] | None = None
    if fields.get("scope") == "selection":
        try:
            ids = bulk.selected(values, "call", int)
        except ValueError:
            return problem(400, "A selected call is not a call reference.", person)
        if not ids:
            return problem(400, "Select the calls to act on first.", person)
    wanted = "quarantined" if action in ("requeue", "release") else "outcome_unknown"
    params = {**filters, "wanted": wanted, "ids": ids}

    def count(conn: Any) -> int:
        query = "SELECT count(*) AS n FROM (" + Q.parked_chunk + ") c"
        row = fetch_one(conn, query, {**params, "after": 0, "limit": None})
        return int(row["n"]) if row else 0

    def chunk(conn: Any, after: int) -> tuple[list[Row], Any]:
        rows = fetch_all(conn, Q.parked_chunk, {**params, "after": after, "limit": bulk.CHUNK})
        return rows, rows[-1]["id"] if len(rows) == bulk.CHUNK else None

    def act(conn: Any, call: Row) -> object:
        return on_call(conn, call["id"], action, person.name, result)

    action_of = bulk.Bulk(count=count, chunk=chunk, act=act)
    return await confirm_then_run(request, person, values, action_of, CALL_WORDS[action])


def _call_words(
    title: str, verb: str, noun: str, effect: str, button: str, did: str
) -> bulk.Wording:
    return bulk.Wording(title, verb, noun, effect, button, did, back="/console/parked")


CALL_WORDS = {
    "requeue": _call_words(
        "Requeue parked calls",
        "requeues",
        "quarantined calls",
        "each is due at once, its attempts kept, journaled with your name.",
        "Requeue {n} calls",
        "Requeued {n} calls",
    ),
    "release": _call_words(
        "Release parked calls",
        "releases",
        "quarantined calls",
        "each leaves its quarantine, due at once, its attempts kept, journaled with your name.",
        "Release {n} calls",
        "Released {n} calls",
    ),
    "not-happened": _call_words(
        "Reconcile parked calls",
        "reconciles",
        "calls whose outcome is unknown",
        "you say their side effect did not happen: each runs again, its attempts kept, "
        "journaled with your name.",
        "Run {n} calls again",
        "Queued {n} calls again",
    ),
    "happened": _call_words(
        "Reconcile parked calls",
        "reconciles",
        "calls whose outcome is unknown",
        "you say their side effect happened: the answer you gave is recorded as each "
        "one's result (source operator) and its batch goes on, journaled with your name.",
        "Record {n} calls as done",
        "Recorded {n} calls as done",
    ),
}


async def bulk_tenants(request: Request) -> Response:
    """Pause or resume the selected tenants (the ``tenant`` checkboxes), each through
    ``policy.pause_tenant`` or ``resume_tenant`` with the person as actor, confirmed with
    the count (``confirm_then_run``). A tenant's operator selects their own tenant only."""
    asked = await operator_form(request, "Only an operator pauses and resumes tenants.")
    if isinstance(asked, Response):
        return asked
    person, values = asked
    fields = {name: given[0] for name, given in values.items()}
    pausing = fields.get("action") == "pause"
    if fields.get("action") not in ("pause", "resume"):
        return problem(400, "Choose pause or resume.", person)
    tenants = bulk.selected(values, "tenant", str)
    if not tenants:
        return problem(400, "Select the tenants first.", person)
    if not person.every_tenant and tenants != [person.tenant_id]:
        return problem(403, f"You act on tenant {person.tenant_id} only.", person)
    try:
        for tenant in tenants:
            calls.check_tenant(tenant)
    except InvalidInput as err:
        return problem(400, str(err), person)
    reason = fields.get("reason", "")

    def to_change(conn: Any, part: list[str]) -> list[Row]:
        paused = {p["tenant_id"] for p in policy.pauses(conn)}
        return [{"tenant_id": t} for t in part if (t in paused) != pausing]

    def act(conn: Any, row: Row) -> object:
        if pausing:
            return policy.pause_tenant(conn, row["tenant_id"], actor=person.name, reason=reason)
        return policy.resume_tenant(conn, row["tenant_id"], actor=person.name)

    action = bulk.Bulk(
        count=lambda conn: len(to_change(conn, tenants)),
        chunk=bulk.positions(tenants, to_change),
        act=act,
        own_reads=True,
    )
    words = PAUSE_WORDS if pausing else RESUME_WORDS
    return await confirm_then_run(request, person, values, action, words)


PAUSE_WORDS = bulk.Wording(
    title="Pause tenants",
    verb="pauses",
    noun="tenants",
    effect="no relay claims their work until they are resumed: effects in flight finish, "
    "nothing new starts, nothing is lost; each journaled with your name and the reason.",
    button="Pause {n} tenants",
    did="Paused {n} tenants",
    back="/console/operations",
)
RESUME_WORDS = bulk.Wording(
    title="Resume tenants",
    verb="resumes",
    noun="paused tenants",
    effect="their runs go on from where they held, each journaled with your name.",
    button="Resume {n} tenants",
    did="Resumed {n} tenants",
    back="/console/operations",
)


async def bulk_tools(request: Request) -> Response:
    """Switch the selected tools (the ``tool`` checkboxes) off or on for a tenant (``*``:
    every tenant, for a platform operator), each through ``policy.disable_tool`` or
    ``enable_tool`` with the person as actor, confirmed with the count
    (``confirm_then_run``)."""
    asked = await operator_form(request, "Only an operator switches tools off and on.")
    if isinstance(asked, Response):
        return asked
    person, values = asked
    fields = {name: given[0] for name, given in values.items()}
    disabling = fields.get("action") == "disable"
    if fields.get("action") not in ("disable", "enable"):
        return problem(400, "Choose disable or enable.", person)
    tools = bulk.selected(values, "tool", str)
    if not tools:
        return problem(400, "Select the tools first.", person)
    tenant = fields.get("tenant") or person.tenant_id
    if not person.every_tenant and tenant != person.tenant_id:
        return problem(403, f"You act on tenant {person.tenant_id} only.", person)
    reason = fields.get("reason", "")

    def to_change(conn: Any, part: list[str]) -> list[Row]:
        off = {s["tool_name"] for s in policy.switches(conn) if s["tenant_id"] == tenant}
        return [{"name": t} for t in part if (t in off) != disabling]

    def count(conn: Any) -> int:
        known = {t["name"] for t in registry.list_tools(conn)}
        if unknown := [t for t in tools if t not in known]:
            raise NotFound(f"tool {unknown[0]!r} is not registered", hint="`outbox tools list`")
        return len(to_change(conn, tools))

    def act(conn: Any, row: Row) -> object:
        if disabling:
            return policy.disable_tool(conn, row["name"], tenant, actor=person.name, reason=reason)
        return policy.enable_tool(conn, row["name"], tenant, actor=person.name)

    action = bulk.Bulk(count=count, chunk=bulk.positions(tools, to_change), act=act, own_reads=True)
    where = "every tenant" if tenant == policy.ALL_TENANTS else f"tenant {tenant}"
    if disabling:
        effect = (
            f'for {where}, their calls not yet dispatched are answered "disabled" instead '
            "of running (the model sees it, with the reason); calls already running finish. "
            "Each is journaled with your name and the reason."
        )
        words = bulk.Wording(
            "Switch tools off",
            "switches off",
            "tools",
            effect,
            "Switch {n} tools off",
            "Switched {n} tools off",
            "/console/operations",
        )
    else:
        effect = f"for {where}, their calls run again; each journaled with your name."
        words = bulk.Wording(
            "Switch tools on",
            "switches on",
            "tools switched off",
            effect,
            "Switch {n} tools on",
            "Switched {n} tools on",
            "/console/operations",
        )
    return await confirm_then_run(request, person, values, action, words)


# -- operations ---------------------------------------------------------------------------


def operations_view(store: Store, person: Person, shown: str | None = None) -> dict[str, Any]:
    """What an operator watches, of the person's tenant (every tenant's for ``*``): stuck
    runs, the queue, the tools with their switches and limits, the tenants with their
    pauses, budgets and limits (and ``shown``, a tenant a platform operator named). Read as
    the pool's own login, as the command line reads them (the views run with their owner's
    rights; no tenant role is granted them), each filtered to the person's tenant; the
    budgets under the tenant's row-level security."""
    scope = _scope(person)

    def mine(tenant_id: str) -> bool:
        return scope is None or tenant_id in (scope, policy.ALL_TENANTS)

    with store.pool.connection() as conn:
        stuck = fetch_all(conn, Q.stuck_runs, {"tenant_id": scope, "limit": INBOX_LIMIT})
        queue = fetch_all(conn, Q.queue_health, {"tenant_id": scope})
        tools = [t for t in registry.list_tools(conn) if mine(t["tenant_id"])]
        switched = [s for s in policy.switches(conn) if mine(s["tenant_id"])]
        pauses = [p for p in policy.pauses(conn) if mine(p["tenant_id"])]
        lanes = {(lane["scope"], lane["name"]): lane for lane in limits.in_flight(conn)}
        claims = ops.queue_stats(conn)["claim_to_start"] if scope is None else None
        if scope is None:
            tenant_budgets = fetch_all(conn, Q.tenant_budgets, {"tenant_id": None})
    if scope is not None:
        with store.tenant(scope) as conn:
            tenant_budgets = fetch_all(conn, Q.tenant_budgets, {"tenant_id": scope})
    tenants = sorted(
        {*(p["tenant_id"] for p in pauses), *(b["tenant_id"] for b in tenant_budgets)}
        | {name for kind, name in lanes if kind == "tenant" and mine(name)}
        | {t for t in (scope, shown if scope is None else None) if t is not None}
    )
    return {
        "stuck": stuck,
        "queue": queue,
        "claims": claims,
        "tools": [
            {
                **tool,
                "switches": [s for s in switched if s["tool_name"] == tool["name"]],
                "lane": lanes.get(("tool", tool["name"])),
            }
            for tool in tools
        ],
        "tenants": [
            {
                "tenant_id": tenant,
                "pause": next((p for p in pauses if p["tenant_id"] == tenant), None),
                "budget": next((b for b in tenant_budgets if b["tenant_id"] == tenant), None),
                "lane": lanes.get(("tenant", tenant)),
            }
            for tenant in tenants
        ],
    }


async def operations(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return to_sign_in()
    shown = request.query_params.get("tenant") or None
    if shown is not None:
        try:
            calls.check_tenant(shown)
        except InvalidInput as err:
            return problem(400, str(err), person)
    view = await read_in_thread(operations_view, config(request).store, person, shown)
    return page("operations.html", person=person, message="", **view)


async def operate(request: Request) -> Response:
    """A tool's kill switch (``disable``, ``enable``) or limits (``tool-limit``), a
    tenant's pause (``pause``, ``resume``), budget (``budget``) or limit
    (``tenant-limit``): the library's functions, as ``outbox tools disable|enable|limit``
    and ``outbox tenants pause|resume|budget|limit`` call them, journaled with the person as
    the actor. Only an operator acts, a tenant's operator on their tenant only (a tool's
    switch: for their tenant only); a tool's limits hold for every tenant's calls, so only a
    platform operator sets them. A value that is not valid is refused (400) naming the field
    and what it may be, and nothing changes."""
    asked = await operator_form(request, "Only an operator changes switches, pauses and limits.")
    if isinstance(asked, Response):
        return asked
    person, values = asked
    fields = {name: given[0] for name, given in values.items()}
    action = request.path_params["action"]
    if action not in OPERATIONS:
        return problem(404, "No such action.", person)
    tenant = fields.get("tenant") or person.tenant_id
    if not person.every_tenant and tenant != person.tenant_id:
        return problem(403, f"You act on tenant {person.tenant_id} only.", person)
    if action in TENANT_OPERATIONS and tenant == policy.ALL_TENANTS:
        return problem(400, "Name the tenant to act on.", person)
    if action == "tool-limit" and not person.every_tenant:
        message = (
            "A tool's limits hold for every tenant's calls: only a platform operator sets them."
        )
        return problem(403, message, person)
    store = config(request).store
    try:
        settings = _settings(action, fields)
        await in_thread(_operate, store, person, action, tenant, fields, settings)
    except OutboxError as err:
        status = 400 if isinstance(err, InvalidInput | NotFound) else 409
        view = await read_in_thread(operations_view, store, person)
        return page("operations.html", status, person=person, message=str(err), **view)
    return RedirectResponse("/console/operations", status_code=303)


def _settings(action: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """The numbers of a budget's or a limit's form, checked as the command line checks
    them; a blank field is no limit of that kind (``InvalidInput`` names the field)."""
    if action == "budget":
        tokens, cost = fields.get("max_tokens", "").strip(), fields.get("max_cost", "").strip()
        if not tokens and not cost:
            raise InvalidInput("a budget needs a limit: a token budget, a budget in money or both")
        return {
            "max_tokens": budgets.tokens(tokens, "the token budget") if tokens else None,
            "max_cost": budgets.money(cost, "the budget in money") if cost else None,
        }
    if action == "tenant-limit":
        return {"max_concurrency": _limit(fields, "max_concurrency", int, "At once")}
    if action == "tool-limit":
        return {
            "max_concurrency": _limit(fields, "max_concurrency", int, "At once"),
            "rate": _limit(fields, "rate", float, "A second"),
        }
    return {}


def _limit(fields: Mapping[str, str], name: str, kind: type[int] | type[float], label: str) -> Any:
    try:
        return limits.parse_limit(fields.get(name, "").strip() or "none", kind)
    except InvalidInput as err:
        raise InvalidInput(f"{label}: {err.args[0]}") from None


def _operate(
    store: Store,
    person: Person,
    action: str,
    tenant: str,
    fields: Mapping[str, str],
    settings: dict[str, Any],
) -> None:
    reason, tool, actor = fields.get("reason", ""), fields.get("tool", ""), person.name
    with store.pool.connection() as conn:
        if action == "disable":
            policy.disable_tool(conn, tool, tenant, actor=actor, reason=reason)
        elif action == "enable":
            policy.enable_tool(conn, tool, tenant, actor=actor)
        elif action == "pause":
            policy.pause_tenant(conn, tenant, actor=actor, reason=reason)
        elif action == "resume":
            policy.resume_tenant(conn, tenant, actor=actor)
        elif action == "budget":
            budgets.set_tenant_budget(conn, tenant, **settings, actor=actor)
        elif action == "tenant-limit":
            limits.set_limits(conn, "tenant", tenant, **settings, actor=actor)
        else:
            if not any(t["name"] == tool for t in registry.list_tools(conn)):
                raise NotFound(f"tool {tool!r} is not registered", hint="`outbox tools list`")
            limits.set_limits(conn, "tool", tool, **settings, actor=actor)


TENANT_OPERATIONS = ("pause", "resume", "budget", "tenant-limit")
OPERATIONS = ("disable", "enable", "tool-limit", *TENANT_OPERATIONS)


# -- a run's timeline ---------------------------------------------------------------------


def run_row(store: Store, person: Person, run_id: uuid.UUID) -> Row:
    """The run's tenant, status and trace context, if the person may see the run
    (NotFound otherwise)."""
    if person.every_tenant:
        with store.pool.connection() as conn:
            row = fetch_one(conn, Q.run_state, {"run_id": run_id})
    else:
        with store.tenant(person.tenant_id) as conn:
            row = fetch_one(conn, Q.run_state, {"run_id": run_id})
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    return row


def run_state(store: Store, person: Person, run_id: uuid.UUID) -> tuple[str, str]:
    """The run's tenant and status, if the person may see the run (NotFound otherwise)."""
    row = run_row(store, person, run_id)
    return str(row["tenant_id"]), str(row["status"])


def timeline(
    store: Store, person: Person, run_id: uuid.UUID, traced: bool = False
) -> tuple[str, events.Poll, str | None]:
    """The run's tenant, its status and journal events (the first ``events.BATCH``), and
    when ``traced`` its trace id (server.console.trace_links)."""
    tenant, trace_id = person.tenant_id, None
    if person.every_tenant or traced:
        row = run_row(store, person, run_id)
        tenant = str(row["tenant_id"])
        trace_id = trace_links.run_trace(run_id, row["traceparent"], row["tracestate"])
    try:
        return tenant, events.read(store, tenant, run_id, 0), trace_id
    except APIError as err:
        raise NotFound(f"run {run_id} does not exist") from err


def trace_of(
    template: str | None, run_id: uuid.UUID, trace_id: str | None, poll: events.Poll
) -> dict[str, Any] | None:
    """The links of a timeline to its run's trace (``--trace-url-template``): the run's,
    and with ``{span_id}`` in the template each event's that completed an attempt (a model
    turn's or a call's span)."""
    if template is None or trace_id is None:
        return None
    spans: dict[int, str] = {}
    if "{span_id}" in template:
        for event in poll.events:
            if span := trace_links.event_span(event.get("detail")):
                spans[event["id"]] = trace_links.link(template, trace_id, span)
    run = trace_links.link(template, trace_id, trace_links.run_span(run_id))
    return {"run": run, "spans": spans}


def _run_id(request: Request) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.path_params["run_id"])
    except ValueError:
        return None


async def run_page(request: Request, fragment: bool = False) -> Response:
    person = await signed_in(request)
    if person is None:
        return problem(401, "Sign in again.") if fragment else to_sign_in()
    run_id = _run_id(request)
    if run_id is None:
        return problem(404, "No such run.", person)
    template: str | None = getattr(request.app.state, "console_trace_url", None)
    store = config(request).store
    try:
        tenant, poll, trace_id = await read_in_thread(
            timeline, store, person, run_id, template is not None
        )
    except NotFound:
        return problem(404, f"No run {run_id} in your tenant.", person)
    name = "_timeline.html" if fragment else "run.html"
    trace = trace_of(template, run_id, trace_id, poll)
    return page(name, person=person, run_id=run_id, tenant=tenant, poll=poll, trace=trace)


async def run_fragment(request: Request) -> Response:
    return await run_page(request, fragment=True)


async def run_events(request: Request) -> Response:
    person = await signed_in(request)
    run_id = _run_id(request)
    if person is None or run_id is None:
        return problem(401, "Sign in again.")
    try:
        await read_in_thread(run_state, config(request).store, person, run_id)
    except NotFound:
        return problem(404, f"No run {run_id} in your tenant.", person)
    session = Session(config(request).store, request.cookies[auth.COOKIE], person)
    return EventSourceResponse(_run_changes(config(request), session, run_id))


async def _run_changes(
    cfg: Config, session: Session, run_id: uuid.UUID
) -> AsyncIterator[dict[str, Any]]:
    """``changed`` whenever a journal event of the run or a change of its status commits
    (the server's listener on ``outbox_journal`` and ``outbox_runs``, server.wakeups): the
    page fetches its timeline again. ``end`` once the run ended, ``signed_out`` once the
    session did (``Session``). It never reads the journal itself: a change costs a read of
    the run's status, and a quiet run only the session's every ``SESSION_CHECK_S``."""
    with cfg.wakeups.watch(run_id, journal=True) as watch:
        yield {"event": "ready", "data": ""}
        while True:
            watch.clear()  # before the reads: a change during them wakes the wait below
            person = await session.current()
            if person is None:
                yield SIGNED_OUT
                return
            try:
                _tenant, status = await read_in_thread(run_state, cfg.store, person, run_id)
            except NotFound:  # its thread deleted meanwhile
                yield {"event": "end", "data": ""}
                return
            if status in constants.ENDED:
                yield {"event": "end", "data": ""}
                return
            await watch.changed(UNLISTENED_S, listened_s=SESSION_CHECK_S)
            if watch.flag.is_set() or not cfg.wakeups.listening:
                yield {"event": "changed", "data": ""}


async def home(_request: Request) -> Response:
    return RedirectResponse("/console/approvals", status_code=303)


MOUNT = Mount(
    "/console",
    routes=[
        Route("/", home),
        Route("/sign-in", sign_in_page, methods=["GET"]),
        Route("/sign-in", sign_in, methods=["POST"]),
        Route("/sign-in/oidc", oidc_start, methods=["GET"]),
        Route("/sign-in/oidc/callback", oidc_callback, methods=["GET"]),
        Route("/sign-out", sign_out, methods=["POST"]),
        Route("/approvals", inbox, methods=["GET"]),
        Route("/approvals/list", inbox_list, methods=["GET"]),
        Route("/approvals/events", inbox_events, methods=["GET"]),
        Route("/approvals/{approval_id:int}/decide", decide, methods=["POST"]),
        Route("/parked", parked, methods=["GET"]),
        Route("/parked/bulk", bulk_calls, methods=["POST"]),
        Route("/parked/{ref:int}/{action}", act_on_call, methods=["POST"]),
        Route("/operations", operations, methods=["GET"]),
        Route("/operations/bulk-tenants", bulk_tenants, methods=["POST"]),
        Route("/operations/bulk-tools", bulk_tools, methods=["POST"]),
        Route("/operations/{action}", operate, methods=["POST"]),
        Route("/runs", runs, methods=["GET"]),
        Route("/runs/bulk-cancel", bulk_cancel, methods=["POST"]),
        Route("/runs/{run_id}", run_page, methods=["GET"]),
        Route("/runs/{run_id}/timeline", run_fragment, methods=["GET"]),
        Route("/runs/{run_id}/events", run_events, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="console-static"),
    ],
)
# Outside the routing, so its errors carry the headers too (server.app adds it).
MIDDLEWARE = Middleware(auth.SecurityHeaders)
