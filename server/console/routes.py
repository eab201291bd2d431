"""The console's pages, forms and live streams, mounted at ``/console`` (``MOUNT``).

Pages: the sign-in, the approvals inbox (``/console/approvals``), the runs list
(``/console/runs``, keyset-paginated), a run's timeline (``/console/runs/{id}``) and the
parked calls (``/console/parked``, with release, requeue and a bulk requeue). The inbox and
the timeline are also served alone as fragments (``.../list``, ``.../timeline``) that the
page's script fetches again when the page's event stream says something changed
(``.../events``); without the script a reload shows the same truth.

Rules: a GET without a session is sent to the sign-in; a POST without one, or without the
session's CSRF token, is refused (403). A person sees and acts in their own tenant only,
through the server's tenant-scoped transactions (row-level security): another tenant's
approval, run or call is a 404, as in the API. A viewer decides nothing, only operators act
on calls (403). Decisions go through ``outbox.approvals.decide`` and call actions through
``outbox.ops`` with the person's name as the actor, journaled as the CLI's are. A platform
operator (tenant ``*``) reads and acts through the pool's own login, which sees every
tenant; so do call actions once the call is found in the person's tenant (``outbox_api``
may not change the queue).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractContextManager
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

from outbox import accounts, approvals, constants, lifecycle, limits, ops, policy, registry
from outbox.accounts import Person
from outbox.errors import NotFound, OutboxError
from outbox.logs import log
from outbox.server import QUERIES, events
from outbox.server.console import STATIC, TEMPLATES, auth, oidc, redact, trace_links
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
BULK_CHUNK = 200  # calls a bulk action changes in one transaction
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
    with _reading(store, person) as conn:
        rows = fetch_all(conn, Q.runs_page, {**params, "limit": RUNS_PAGE})
        return rows, runs_matched(conn, params)


def _in_scope(person: Person, params: dict[str, Any]) -> dict[str, Any]:
    """The list's filters, of the person's tenant only (any tenant for ``*``)."""
    return params if person.every_tenant else {**params, "tenant_id": person.tenant_id}


def _reading(store: Store, person: Person) -> AbstractContextManager[Any]:
    """A transaction that reads what the person may see: the pool's own login for ``*``,
    their tenant's row-level security otherwise."""
    return store.pool.connection() if person.every_tenant else store.tenant(person.tenant_id)


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


# -- bulk cancel of runs ------------------------------------------------------------------


async def bulk_cancel(request: Request) -> Response:
    """Cancel the active runs of a selection (``scope=selection``: the ``run`` checkboxes)
    or of everything the list's filters match (``scope=filter``). The first post answers the
    count to confirm; a post that confirms the count the server counts again now runs, in
    chunks (``BULK_CHUNK`` runs a transaction), each run through ``lifecycle.cancel_run``
    with the person as actor (journaled as ``outbox runs cancel``), each once."""
    person = await signed_in(request)
    values = await auth.form_values(request)
    fields = {name: given[0] for name, given in values.items()}
    if person is None or not auth.csrf_ok(person.csrf_token, fields.get("csrf_token")):
        return problem(403, "This form did not come from your session.")
    if not person.may_operate:
        return refused(person, "Only an operator cancels runs.")
    selected: list[uuid.UUID] | None = None
    params: dict[str, Any] | None = None
    if fields.get("scope") == "selection":
        try:
            selected = sorted({uuid.UUID(v) for v in values.get("run", [])})
        except ValueError:
            return problem(400, "A selected run is not a run id.", person)
        if not selected:
            return problem(400, "Select the runs to cancel first.", person)
    else:
        params = _filters(fields)
        if params is None:
            return problem(400, "A filter of this list is not valid.", person)
        params = _in_scope(person, params)
    store = config(request).store
    count = await read_in_thread(_count_cancellable, store, person, params, selected)
    context: dict[str, Any] = {"person": person, "count": count, "selected": selected}
    context["fields"] = fields
    if fields.get("confirm") != str(count) or count == 0:
        return page("bulk_cancel.html", **context)
    done, skipped = await in_thread(_cancel_all, store, person, params, selected)
    message = f"Cancelled {done} runs" + (f"; {skipped} had ended meanwhile." if skipped else ".")
    return page("bulk_cancel.html", **context, done=message)


def _count_cancellable(
    store: Store, person: Person, params: dict[str, Any] | None, selected: list[uuid.UUID] | None
) -> int:
    """How many active runs the selection or the filters take (that the person may see)."""
    with _reading(store, person) as conn:
        if selected is not None:
            row = fetch_one(conn, Q.active_runs_count, {"ids": selected, "active": ACTIVE})
        else:
            every = {**(params or {}), "before_at": None, "before_id": None, "limit": None}
            query = (
                "SELECT count(*) AS n FROM (" + Q.runs_page + ") m WHERE m.status = ANY(%(active)s)"
            )
            row = fetch_one(conn, query, {**every, "active": ACTIVE})
    return int(row["n"]) if row else 0


def _cancel_all(
    store: Store, person: Person, params: dict[str, Any] | None, selected: list[uuid.UUID] | None
) -> tuple[int, int]:
    """Cancel in chunks of ``BULK_CHUNK`` runs, one transaction each: a selection in the
    order of its ids, a filter newest first by its keyset (a cancel changes neither key, so
    each run is taken once). The runs are read as the person may see them; the cancel runs
    as the pool's own login, as the command line's. (cancelled, skipped)."""
    done = skipped = position = 0
    cursor: tuple[Any, Any] = (None, None)
    while True:
        with _reading(store, person) as conn:
            if selected is not None:
                chunk = selected[position : position + BULK_CHUNK]
                position += BULK_CHUNK
                rows = fetch_all(conn, Q.active_runs_of, {"ids": chunk, "active": ACTIVE})
                more = bool(chunk)
            else:
                keyset = {"before_at": cursor[0], "before_id": cursor[1], "limit": BULK_CHUNK}
                rows = fetch_all(conn, Q.runs_page, {**(params or {}), **keyset})
                more = bool(rows)
                if rows:
                    cursor = (rows[-1]["created_at"], rows[-1]["id"])
        if not more:
            return done, skipped
        with store.pool.connection() as conn:
            for row in rows:
                if row["status"] not in ACTIVE:
                    continue
                try:
                    lifecycle.cancel_run(conn, row["id"], row["tenant_id"], actor=person.name)
                    done += 1
                except OutboxError:
                    skipped += 1  # it ended meanwhile


ACTIVE = list(constants.ACTIVE)


# -- parked calls -------------------------------------------------------------------------


def parked_calls(store: Store, person: Person) -> list[Row]:
    """The person's tenant's calls parked for an operator (every tenant's for ``*``)."""
    if person.every_tenant:
        with store.pool.connection() as conn:
            return fetch_all(conn, Q.parked_calls, {"tenant_id": None, "limit": INBOX_LIMIT})
    with store.tenant(person.tenant_id) as conn:
        params = {"tenant_id": person.tenant_id, "limit": INBOX_LIMIT}
        return fetch_all(conn, Q.parked_calls, params)


async def parked(request: Request) -> Response:
    person = await signed_in(request)
    if person is None:
        return to_sign_in()
    rows = await read_in_thread(parked_calls, config(request).store, person)
    return page("parked.html", person=person, calls=rows, message="")


async def act_on_call(request: Request) -> Response:
    person = await signed_in(request)
    fields = await auth.form(request)
    if person is None or not auth.csrf_ok(person.csrf_token, fields.get("csrf_token")):
        return problem(403, "This form did not come from your session.")
    if not person.may_operate:
        return refused(person, "Only an operator acts on calls.")
    action = request.path_params["action"]
    if action not in (*OPERATOR_ACTIONS, "reconcile"):
        return problem(404, "No such action.", person)
    ref = int(request.path_params["ref"])
    settled: tuple[bool, Any] | None = None
    if action == "reconcile":
        settled = _settlement(fields)
        if settled is None:
            message = (
                "Say whether the call's side effect happened and, if it did, give what the "
                'tool answered as JSON (for example {"refund_id": "r-7"}).'
            )
            return problem(400, message, person)
    store = config(request).store
    try:
        await in_thread(_act_on_call, store, person, ref, action, settled)
    except NotFound:
        return problem(404, f"No tool call {ref} in your tenant.", person)
    except OutboxError as err:
        rows = await read_in_thread(parked_calls, store, person)
        message = err.args[0] if err.args else str(err)
        return page("parked.html", 409, person=person, calls=rows, message=message)
    return RedirectResponse("/console/parked", status_code=303)


def _settlement(fields: dict[str, str]) -> tuple[bool, Any] | None:
    """A reconcile form's word: (happened, the call's output); None when it is not valid."""
    happened = fields.get("happened")
    if happened == "no":
        return False, None
    if happened != "yes":
        return None
    try:
        return True, json.loads(fields.get("result", ""))
    except ValueError:
        return None


def _act_on_call(
    store: Store, person: Person, ref: int, action: str, settled: tuple[bool, Any] | None
) -> None:
    """``ops.requeue``, ``ops.release`` or ``ops.reconcile`` (``settled``: whether the side
    effect happened, and its output) of the call, journaled with the person as actor, as
    ``outbox requeue``, ``release`` and ``reconcile``. The call must be the person's
    tenant's (read under its row-level security); the action then runs as the pool's own
    login, as the command line's (``outbox_api`` may not change the queue)."""
    if not person.every_tenant:
        with store.tenant(person.tenant_id) as conn:
            if fetch_one(conn, Q.call_tenant, {"id": ref}) is None:
                raise NotFound(f"tool call {ref} does not exist")
    with store.pool.connection() as conn:
        if settled is not None:
            happened, result = settled
            ops.reconcile(conn, f"call:{ref}", happened=happened, result=result, actor=person.name)
        else:
            OPERATOR_ACTIONS[action](conn, f"call:{ref}", actor=person.name)


OPERATOR_ACTIONS: dict[str, Any] = {"requeue": ops.requeue, "release": ops.release}


async def bulk_requeue(request: Request) -> Response:
    """Requeue every quarantined call of the tenant (of one tool, when given). The first
    post answers the count to confirm; a post that confirms the count the server counts
    again now runs, in chunks (``BULK_CHUNK`` calls a transaction), each call through
    ``ops.requeue`` (journaled with the person), each once."""
    person = await signed_in(request)
    fields = await auth.form(request)
    if person is None or not auth.csrf_ok(person.csrf_token, fields.get("csrf_token")):
        return problem(403, "This form did not come from your session.")
    if not person.may_operate:
        return refused(person, "Only an operator acts on calls.")
    tool = fields.get("tool") or None
    store = config(request).store
    count = await read_in_thread(_count_quarantined, store, person, tool)
    if fields.get("confirm") != str(count) or count == 0:
        return page("bulk.html", person=person, tool=tool, count=count)
    done, skipped = await in_thread(_requeue_all, store, person, tool)
    rows = await read_in_thread(parked_calls, store, person)
    message = f"Requeued {done} calls" + (f"; {skipped} could not be requeued." if skipped else ".")
    return page("parked.html", person=person, calls=rows, message="", done=message)


def _scope(person: Person) -> str | None:
    return None if person.every_tenant else person.tenant_id


def _count_quarantined(store: Store, person: Person, tool: str | None) -> int:
    params = {"tenant_id": _scope(person), "tool": tool}
    if person.every_tenant:
        with store.pool.connection() as conn:
            row = fetch_one(conn, Q.count_quarantined, params)
    else:
        with store.tenant(person.tenant_id) as conn:
            row = fetch_one(conn, Q.count_quarantined, params)
    return int(row["n"]) if row else 0


def _requeue_all(store: Store, person: Person, tool: str | None) -> tuple[int, int]:
    """Requeue the quarantined calls in chunks of ``BULK_CHUNK``, one transaction each, in
    the order of their references: (requeued, skipped)."""
    done = skipped = after = 0
    while True:
        params = {"tenant_id": _scope(person), "tool": tool, "after": after, "limit": BULK_CHUNK}
        if person.every_tenant:
            with store.pool.connection() as conn:
                chunk = [r["id"] for r in fetch_all(conn, Q.quarantined_chunk, params)]
        else:
            with store.tenant(person.tenant_id) as conn:  # only the tenant's calls
                chunk = [r["id"] for r in fetch_all(conn, Q.quarantined_chunk, params)]
        if not chunk:
            return done, skipped
        with store.pool.connection() as conn:
            for ref in chunk:
                try:
                    ops.requeue(conn, f"call:{ref}", actor=person.name)
                    done += 1
                except OutboxError:
                    skipped += 1  # no longer quarantined, or its run ended meanwhile
        after = chunk[-1]


# -- operations ---------------------------------------------------------------------------


def operations_view(store: Store, person: Person) -> dict[str, Any]:
    """What an operator watches, of the person's tenant (every tenant's for ``*``): stuck
    runs, the queue, the tools with their switches and limits, the tenants with their
    pauses and budgets. Read as the pool's own login, as the command line reads them (the
    views run with their owner's rights; no tenant role is granted them), each filtered to
    the person's tenant; the budgets under the tenant's row-level security."""
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
        | ({scope} if scope is not None else set())
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
    view = await read_in_thread(operations_view, config(request).store, person)
    return page("operations.html", person=person, message="", **view)


async def operate(request: Request) -> Response:
    """A tool's kill switch (``disable``, ``enable``) or a tenant's pause (``pause``,
    ``resume``): ``outbox.policy``'s functions, as ``outbox tools disable`` and ``outbox
    tenants pause`` call them, journaled with the person as the actor. Only an operator
    acts, a tenant's operator only on their tenant (a tool: for their tenant only)."""
    person = await signed_in(request)
    fields = await auth.form(request)
    if person is None or not auth.csrf_ok(person.csrf_token, fields.get("csrf_token")):
        return problem(403, "This form did not come from your session.")
    if not person.may_operate:
        return refused(person, "Only an operator changes switches and pauses.")
    action = request.path_params["action"]
    if action not in OPERATIONS:
        return problem(404, "No such action.", person)
    tenant = fields.get("tenant") or person.tenant_id
    if not person.every_tenant and tenant != person.tenant_id:
        return problem(403, f"You act on tenant {person.tenant_id} only.", person)
    if action in ("pause", "resume") and tenant == policy.ALL_TENANTS:
        return problem(400, "Name the tenant to pause or resume.", person)
    store = config(request).store
    try:
        await in_thread(_operate, store, person, action, tenant, fields)
    except OutboxError as err:
        view = await read_in_thread(operations_view, store, person)
        message = err.args[0] if err.args else str(err)
        return page("operations.html", 409, person=person, message=message, **view)
    return RedirectResponse("/console/operations", status_code=303)


def _operate(
    store: Store, person: Person, action: str, tenant: str, fields: dict[str, str]
) -> None:
    reason, tool = fields.get("reason", ""), fields.get("tool", "")
    with store.pool.connection() as conn:
        if action == "disable":
            policy.disable_tool(conn, tool, tenant, actor=person.name, reason=reason)
        elif action == "enable":
            policy.enable_tool(conn, tool, tenant, actor=person.name)
        elif action == "pause":
            policy.pause_tenant(conn, tenant, actor=person.name, reason=reason)
        else:
            policy.resume_tenant(conn, tenant, actor=person.name)


OPERATIONS = ("disable", "enable", "pause", "resume")


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
        Route("/parked/bulk-requeue", bulk_requeue, methods=["POST"]),
        Route("/parked/{ref:int}/{action}", act_on_call, methods=["POST"]),
        Route("/operations", operations, methods=["GET"]),
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
