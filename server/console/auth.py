"""Who is asking: the console's session cookie, its CSRF token, and the headers every
console answer carries.

A session is a random token in a cookie (HttpOnly, SameSite=Lax, Secure over https, path
``/console``); the database keeps its SHA-256 and a CSRF token (``outbox.accounts``). Every
POST must carry the session's CSRF token in its form: a cross-site form has the cookie but
not the token. The sign-in form, before any session exists, carries a token that must
equal a short-lived cookie of its own (double submit), so a sign-in cannot be forged
either.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import parse_qs

import psycopg
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outbox import accounts
from outbox.accounts import Person
from outbox.server.db_pool import Q, Store

COOKIE = "outbox_console"
SIGN_IN_COOKIE = "outbox_console_sign_in"
PATH = "/console"
MAX_FORM_BYTES = 64 * 1024  # a console form is a few fields
CSP = (
    "default-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """ASGI middleware of the app: every answer under ``/console`` gets ``HEADERS``, its
    errors of routing (404, 405) too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PATH or path.startswith(PATH + "/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in HEADERS}
                kept = [h for h in message.get("headers", []) if h[0] not in names]
                message["headers"] = [*kept, *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


@contextmanager
def as_api(store: Store) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the pool acting as ``outbox_api`` for one transaction (committed on
    success): what the account functions need, before any tenant is known."""
    with store.pool.connection() as conn:
        conn.execute(Q.act_as_api)
        yield conn


def reading(store: Store, person: Person) -> AbstractContextManager[psycopg.Connection[Any]]:
    """A transaction that reads what the person may see: the pool's own login for ``*``,
    their tenant's row-level security otherwise."""
    return store.pool.connection() if person.every_tenant else store.tenant(person.tenant_id)


def person_of(store: Store, token: str | None) -> Person | None:
    """The signed-in person of a session token (None: none, unknown or expired)."""
    if not token:
        return None
    with as_api(store) as conn:
        return accounts.session(conn, token)


async def form(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (the first value of each); empty past the size cap."""
    return {name: values[0] for name, values in (await form_values(request)).items()}


async def form_values(request: Request) -> dict[str, list[str]]:
    """An urlencoded form's fields, every value of each (checkboxes of one name); empty
    past the size cap."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def csrf_ok(expected: str | None, given: str | None) -> bool:
    return bool(expected and given) and secrets.compare_digest(str(expected), str(given))


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def clear_cookie(request: Request, response: Response, name: str) -> None:
    response.delete_cookie(
        name, path=PATH, httponly=True, samesite="lax", secure=request.url.scheme == "https"
    )
